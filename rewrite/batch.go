package rewrite

import (
	"strconv"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// Batch describes a query that is exactly one SELECT leaf_next('tag', n) [AS name]: n
// fresh IDs of tag as n rows of one int8 column. It is a set-returning call, so the proxy
// answers it itself, or, where it cannot (see the proxy), forwards the statement that
// AppendLiteral or AppendParam renders: the IDs as an unnested int8 array.
type Batch struct {
	Column string // result column name as PostgreSQL would name it (the alias when there is one)
	Tag    string // the tag, when it is a literal
	// TagParam is n when the tag is the client's parameter $n (0: a literal).
	TagParam int
	// Count is the number of IDs when it is a literal; the proxy checks its range.
	Count int64
	// CountParam is n when the count is the client's parameter $n (0: a literal).
	CountParam int
}

// AppendLiteral appends the statement the server runs for the batch when the proxy
// cannot answer it itself, in the simple query protocol: the IDs as an array literal.
func (b *Batch) AppendLiteral(dst []byte, ids []int64) []byte {
	dst = append(dst, "SELECT unnest('{"...)
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, id, 10)
	}
	dst = append(dst, "}'::int8[]) AS "...)
	return append(dst, quoteIdent(b.Column)...)
}

// AppendParam appends the statement for the extended protocol: the IDs arrive as the
// int8[] parameter $param.
func (b *Batch) AppendParam(dst []byte, param int) []byte {
	dst = append(dst, "SELECT unnest("...)
	dst = appendParam(dst, param)
	dst = append(dst, "::int8[]) AS "...)
	return append(dst, quoteIdent(b.Column)...)
}

// hintBatch says where the batch form works.
const hintBatch = "leaf_next(tag, n) returns n rows: send it as a query of its own, SELECT leaf_next('tag', n), and use the rows it returns."

// batchCall records leaf_next(tag, n): the plan is a Batch if the call turns out to be the
// whole statement, and refused otherwise (see plan).
func (p *planner) batchCall(fc *pg_query.FuncCall) {
	loc := int(fc.Location)
	if p.batch != nil {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, loc, hintBatch, "leaf_next(tag, n) returns a set of rows and can be called only once, as the whole query"))
		return
	}
	slot, ok := p.tagArg(fc.Args[0], loc)
	if !ok {
		return
	}
	b := &Batch{Tag: slot.Tag, TagParam: slot.Param}
	const hint = "Pass the number of IDs as an integer literal, leaf_next('order', 100), or as a parameter, leaf_next($1, $2)."
	switch x := unwrapIntCast(fc.Args[1]).(type) {
	case *pg_query.A_Const:
		p.read(x.Location)
		switch v := x.Val.(type) {
		case *pg_query.A_Const_Ival:
			b.Count = int64(v.Ival.Ival)
		case *pg_query.A_Const_Fval:
			// An integer beyond int4 comes as a numeric literal; the range check reports it.
			n, err := strconv.ParseInt(v.Fval.Fval, 10, 64)
			if err != nil {
				p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hint, "the number of IDs of leaf_next(tag, n) must be an integer, not %s", v.Fval.Fval))
				return
			}
			b.Count = n
		default:
			p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hint, "the number of IDs of leaf_next(tag, n) must be an integer"))
			return
		}
	case *pg_query.ParamRef:
		p.tagArgs[x.Location] = true // the rewritten text does not reference it
		p.countParams[int(x.Number)] = true
		b.CountParam = int(x.Number)
	default:
		p.fail(p.errAt(sqlstate.InvalidParameterValue, loc, hint, "the number of IDs of leaf_next(tag, n) must be an integer literal or a parameter"))
		return
	}
	p.batch, p.batchLoc = b, loc
}

// unwrapIntCast strips casts to integer types off an argument.
func unwrapIntCast(n *pg_query.Node) any {
	m := unwrap(n)
	for {
		tc, ok := m.(*pg_query.TypeCast)
		if !ok || !isIntType(tc.TypeName) {
			return m
		}
		m = unwrap(tc.Arg)
	}
}

func isIntType(t *pg_query.TypeName) bool {
	if t == nil || len(t.Names) == 0 || len(t.ArrayBounds) > 0 {
		return false
	}
	switch t.Names[len(t.Names)-1].GetString_().GetSval() {
	case "int2", "int4", "int8", "integer", "bigint", "smallint":
		return true
	}
	return false
}

// standaloneBatch returns the Batch when stmt is exactly SELECT leaf_next(tag, n) [AS name]
// and the call is the batch call the planner recorded.
func (p *planner) standaloneBatch(stmt *pg_query.Node) *Batch {
	rt := bareTarget(stmt)
	if rt == nil {
		return nil
	}
	fc := rt.GetVal().GetFuncCall()
	if fc == nil || int(fc.Location) != p.batchLoc || leafFunc(fc) != "leaf_next" {
		return nil
	}
	b := *p.batch
	b.Column = rt.Name
	if b.Column == "" {
		b.Column = "leaf_next"
	}
	return &b
}

// bareTarget returns the one target of a statement that is a SELECT of one expression
// without FROM or any other clause, or nil.
func bareTarget(stmt *pg_query.Node) *pg_query.ResTarget {
	s := stmt.GetSelectStmt()
	if s == nil || len(s.TargetList) != 1 ||
		s.Op != pg_query.SetOperation_SETOP_NONE || s.WithClause != nil || len(s.FromClause) > 0 ||
		s.WhereClause != nil || len(s.GroupClause) > 0 || s.HavingClause != nil || len(s.WindowClause) > 0 ||
		len(s.ValuesLists) > 0 || len(s.SortClause) > 0 || s.LimitCount != nil || s.LimitOffset != nil ||
		len(s.LockingClause) > 0 || len(s.DistinctClause) > 0 || s.IntoClause != nil {
		return nil
	}
	return s.TargetList[0].GetResTarget()
}
