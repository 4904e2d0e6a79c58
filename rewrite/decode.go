package rewrite

import (
	"fmt"
	"strconv"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// SnowflakeLayout is how leaf_decode splits a snowflake ID: from the most significant of
// the 63 usable bits, milliseconds since EpochMillis, then WorkerBits of worker ID, then
// SequenceBits of sequence. The zero value is Leaf's layout (41/10/12 bits, epoch
// 1288834974657).
type SnowflakeLayout struct {
	EpochMillis  int64
	WorkerBits   int
	SequenceBits int
}

func (l SnowflakeLayout) orDefault() SnowflakeLayout {
	if l == (SnowflakeLayout{}) {
		return SnowflakeLayout{EpochMillis: 1288834974657, WorkerBits: 10, SequenceBits: 12}
	}
	return l
}

// Decode describes a query that is exactly SELECT leaf_decode(id): one row with the
// columns timestamp (timestamptz), worker and sequence (bigint) of a snowflake ID. The
// proxy may answer it itself (Split); the rewritten statement (Plan.AppendLiteral and
// AppendParams render it) computes the same columns in PostgreSQL, where the timestamp is
// printed in the session's DateStyle and TimeZone like any other.
type Decode struct {
	// Param is n when the ID is the client's parameter $n, which the proxy checks at Bind;
	// 0 when it is a literal (checked when planned).
	Param int
	// ID is the literal ID when Param is 0.
	ID int64
	// EpochMillis, WorkerBits and SequenceBits are the layout the rewritten text uses, so
	// that an answer of the proxy's own splits the ID alike.
	EpochMillis              int64
	WorkerBits, SequenceBits int
}

// Split returns the Unix milliseconds, worker and sequence of id by the plan's layout.
func (d *Decode) Split(id int64) (millis, worker, sequence int64) {
	sequence = id & (1<<d.SequenceBits - 1)
	worker = (id >> d.SequenceBits) & (1<<d.WorkerBits - 1)
	return (id >> (d.WorkerBits + d.SequenceBits)) + d.EpochMillis, worker, sequence
}

// hintDecode says where leaf_decode works.
const hintDecode = "Call it as a query of its own, SELECT leaf_decode(id), with the ID as an integer literal or a parameter."

// decodeCall plans leaf_decode(id), the whole statement's one target (see plan).
func (p *planner) decodeCall(fc *pg_query.FuncCall) {
	loc := int(fc.Location)
	if p.decode != nil {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, loc, hintDecode, "leaf_decode() can be called only once, as the whole query"))
		return
	}
	if len(fc.Args) != 1 || fc.AggStar || fc.AggDistinct || fc.Over != nil || fc.FuncVariadic {
		p.fail(p.errAt(sqlstate.InvalidParameterValue, loc, hintDecode, "leaf_decode() takes one argument, a snowflake ID"))
		return
	}
	toks := p.tokens()
	i := toks.at(loc)
	k := toks.matchParen(i + 1)
	if i >= len(toks) || int(toks[i].Start) != loc || k < 0 {
		p.internal(loc, "leaf_decode()")
		return
	}
	var arg string
	d := &Decode{}
	switch x := unwrapIntCast(fc.Args[0]).(type) {
	case *pg_query.A_Const:
		p.read(x.Location)
		var id int64
		var err error
		switch v := x.Val.(type) {
		case *pg_query.A_Const_Ival:
			id = int64(v.Ival.Ival)
		case *pg_query.A_Const_Fval:
			id, err = strconv.ParseInt(v.Fval.Fval, 10, 64)
		default:
			err = fmt.Errorf("not an integer")
		}
		if err != nil || x.Isnull {
			p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hintDecode, "the argument of leaf_decode() must be a 64-bit integer"))
			return
		}
		if id < 0 {
			p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hintDecode, "%d is not a snowflake ID: IDs are not negative", id))
			return
		}
		arg = strconv.FormatInt(id, 10)
		d.ID = id
	case *pg_query.ParamRef:
		d.Param = int(x.Number)
		arg = "$" + strconv.Itoa(d.Param)
	default:
		p.fail(p.errAt(sqlstate.InvalidParameterValue, loc, hintDecode, "the argument of leaf_decode() must be an integer literal or a parameter"))
		return
	}
	l := p.rw.layout
	d.EpochMillis, d.WorkerBits, d.SequenceBits = l.EpochMillis, l.WorkerBits, l.SequenceBits
	x := "(" + arg + ")::int8"
	text := fmt.Sprintf("to_timestamp(0) + ((%s >> %d) + %d) * interval '1 millisecond' AS \"timestamp\", (%s >> %d) & %d AS worker, %s & %d AS sequence",
		x, l.WorkerBits+l.SequenceBits, l.EpochMillis, x, l.SequenceBits, int64(1)<<l.WorkerBits-1, x, int64(1)<<l.SequenceBits-1)
	p.decode, p.decodeLoc = d, loc
	p.add(slotEdit{edit: edit{start: loc, end: int(toks[k].End), text: text}})
}

// standaloneDecode reports whether stmt is exactly SELECT leaf_decode(id), without an
// alias (the call stands for three columns), and the call is the one recorded.
func (p *planner) standaloneDecode(stmt *pg_query.Node) bool {
	rt := bareTarget(stmt)
	if rt == nil || rt.Name != "" {
		return false
	}
	fc := rt.GetVal().GetFuncCall()
	return fc != nil && int(fc.Location) == p.decodeLoc
}

// isDecode reports whether fc calls leaf_decode: an unqualified name.
func isDecode(fc *pg_query.FuncCall) bool {
	return len(fc.Funcname) == 1 && fc.Funcname[0].GetString_().GetSval() == "leaf_decode"
}
