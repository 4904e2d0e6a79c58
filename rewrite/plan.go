package rewrite

import (
	"fmt"
	"strconv"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// SlotKind says where the ID for a slot comes from.
type SlotKind uint8

const (
	// SlotTag is leaf_next('tag') or a fill rule: an ID of a tag known at plan time.
	SlotTag SlotKind = iota + 1
	// SlotTagParam is leaf_next($n): the tag is the client's parameter n,
	// known only at execution (Bind, or an EXECUTE argument).
	SlotTagParam
	// SlotSnowflake is leaf_snowflake().
	SlotSnowflake
)

// String returns the kind's name as the golden files print it.
func (k SlotKind) String() string {
	switch k {
	case SlotTag:
		return "tag"
	case SlotTagParam:
		return "param"
	case SlotSnowflake:
		return "snowflake"
	}
	return "SlotKind(" + strconv.Itoa(int(k)) + ")"
}

// Slot is one ID needed per execution.
type Slot struct {
	Kind  SlotKind
	Tag   string // SlotTag
	Param int    // SlotTagParam: 1-based client parameter holding the tag
	// Max, when not 0, is the largest ID the slot's column holds (an integer
	// or smallint key): a larger ID must be refused with 22003 before the
	// statement leaves the proxy.
	Max int64
}

// String renders a slot as the golden files print it: tag:order, param:$1, snowflake.
func (s Slot) String() string {
	switch s.Kind {
	case SlotTag:
		if s.Max != 0 {
			return "tag:" + s.Tag + " max=" + strconv.FormatInt(s.Max, 10)
		}
		return "tag:" + s.Tag
	case SlotTagParam:
		return "param:$" + strconv.Itoa(s.Param)
	}
	return s.Kind.String()
}

// FastPath describes a query that is exactly one SELECT leaf_next('tag') or
// SELECT leaf_snowflake(): the proxy may answer it without the database.
type FastPath struct {
	Column string // result column name as PostgreSQL would name it (the alias when there is one)
	Slot   Slot
}

// Prepare describes SQL-level PREPARE name AS <statement with slots>. The
// rewritten PREPARE declares the slots as trailing int8 parameters, so every
// EXECUTE of Name must append one ID per slot as extra arguments.
type Prepare struct {
	Name  string
	Slots []Slot
}

// Execute describes SQL-level EXECUTE name[(args)]. The proxy looks up the
// slots it recorded for Name in its session; when there are any, the plan's
// Append methods add the IDs as extra arguments.
type Execute struct {
	Name string
	Args []Arg // the statement's own arguments, in order
}

// Arg is one argument of an EXECUTE.
type Arg struct {
	Value  string // the value of a string literal
	String bool   // whether the argument is a string literal (possibly cast)
	Param  int    // n when the argument is the client parameter $n (EXECUTE sent through the extended protocol)
}

// Tag returns the tag an EXECUTE passes for a SlotTagParam slot of the
// prepared statement: argument param (1-based) must be a non-empty string
// literal. When the argument is itself a client parameter (Arg.Param > 0),
// the tag arrives in Bind and Tag reports 22023; the proxy reads it there.
func (e *Execute) Tag(param int) (string, error) {
	if param < 1 || param > len(e.Args) {
		return "", &Error{Code: sqlstate.InvalidParameterValue, Message: fmt.Sprintf("EXECUTE %s has no argument $%d for the leaf_next tag", e.Name, param)}
	}
	a := e.Args[param-1]
	if !a.String || a.Value == "" {
		return "", &Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("argument $%d of EXECUTE %s is a leaf_next tag and must be a non-empty string literal", param, e.Name),
			Hint:    "Pass the tag as a quoted literal, e.g. EXECUTE name('order')."}
	}
	return a.Value, nil
}

// CopyFill describes COPY table (columns) FROM STDIN into a filled table whose
// column list leaves keys out: the rewritten statement lists them after the
// client's columns, and the proxy appends one field per key, a fresh ID, to every
// row of the data stream, in the COPY's format.
type CopyFill struct {
	Keys    []Slot   // one per key column added, in the order they are added
	Columns []string // the key columns' names, in the same order
	Format  CopyFormat
}

// CopyFormat is what the proxy must know of a COPY's options to find its rows and
// append fields to them. Invalid options are the server's to report (it does so
// before it reads any data), so they are not checked here.
type CopyFormat struct {
	Kind      string // "binary", "text" or "csv"
	Delimiter byte   // text: tab, csv: comma
	Quote     byte   // csv: the quote character ('"')
	Escape    byte   // csv: the escape character (the quote character)
	// Header is "" (no header line), "true" (the first line is skipped) or "match" (the
	// first line must name the columns).
	Header string
}

// Deallocate describes DEALLOCATE [PREPARE] name | ALL and DISCARD ALL
// (which deallocates everything).
type Deallocate struct {
	Name string
	All  bool
}

// SessionRef is an EXECUTE or DEALLOCATE inside a string of several statements.
type SessionRef struct {
	Name string // prepared-statement name; empty when All
	All  bool   // DEALLOCATE ALL or DISCARD ALL
}

// Plan is how to rewrite one SQL string. Plans are immutable and shared
// between sessions through the cache.
type Plan struct {
	// Slots lists one ID per slot per execution, in textual order.
	Slots []Slot
	// MaxParam is the highest $n referenced in the text (outside PREPARE bodies).
	MaxParam int
	// FastPath is non-nil iff the whole string is one bare SELECT leaf_next('tag')
	// or SELECT leaf_snowflake().
	FastPath *FastPath
	// Batch is non-nil iff the whole string is one SELECT leaf_next('tag', n); the plan
	// has no slots then.
	Batch *Batch
	// Decode is non-nil iff the whole string is one SELECT leaf_decode(id); the
	// rewritten text computes the columns.
	Decode *Decode
	// Prepare, Execute and Deallocate are set when the string is that single
	// statement (EXPLAIN EXECUTE and CREATE TABLE … AS EXECUTE count as EXECUTE).
	Prepare    *Prepare
	Execute    *Execute
	Deallocate *Deallocate
	// CopyFill is set when the string is a COPY … FROM STDIN (FORMAT binary)
	// whose rows the proxy must give keys; the text has no slots then.
	CopyFill *CopyFill
	// SessionRefs lists, for a string of several statements, the EXECUTE and
	// DEALLOCATE/DISCARD ALL statements in it; see SessionConflict.
	SessionRefs []SessionRef
	// UnreferencedParams are client parameters that only carried a leaf_next
	// tag and that the rewritten text no longer references: the proxy gives
	// them type text at Parse when the client left the type unspecified.
	UnreferencedParams []int

	sql   string
	edits []edit
	exec  *execEdit
}

// edit replaces sql[start:end] by text followed, when slot >= 0, by the
// rendering of that slot's ID.
type edit struct {
	start, end int
	text       string
	slot       int
}

// execEdit is where an EXECUTE receives the IDs of its prepared statement:
// at pos, either "(id, …)" after the name or ", id, …" before the closing parenthesis.
type execEdit struct {
	pos     int
	hasArgs bool
}

// IDs returns how many IDs AppendLiteral needs for one execution: one per
// slot, plus, for an EXECUTE, the number of slots the session recorded for
// the prepared statement Execute.Name.
func (p *Plan) IDs(prepared int) int {
	if p.exec == nil {
		return len(p.Slots)
	}
	return len(p.Slots) + prepared
}

// AppendLiteral appends the rewritten SQL for the simple query protocol: the
// i-th slot becomes ids[i] as an int8 literal. For an EXECUTE, the IDs after
// the first len(Slots) are appended as extra arguments. It panics when ids is
// shorter than Slots, a caller bug that would otherwise send broken SQL.
func (p *Plan) AppendLiteral(dst []byte, ids []int64) []byte {
	if len(ids) < len(p.Slots) {
		panic(fmt.Sprintf("rewrite: AppendLiteral got %d IDs for %d slots", len(ids), len(p.Slots)))
	}
	extra := ids[len(p.Slots):]
	if p.exec == nil {
		extra = nil
	}
	return p.render(dst, func(dst []byte, i int) []byte { return appendID(dst, ids[i]) },
		len(extra), func(dst []byte, j int) []byte { return appendID(dst, extra[j]) })
}

// AppendParams appends the rewritten SQL for the extended protocol: the i-th
// slot becomes the hidden parameter $(first+i), which the proxy declares as
// int8. first is max(number of client OIDs, MaxParam)+1.
func (p *Plan) AppendParams(dst []byte, first int) []byte {
	return p.render(dst, func(dst []byte, i int) []byte { return appendParam(dst, first+i) }, 0, nil)
}

// AppendExecuteParams is AppendParams for an EXECUTE sent through the
// extended protocol: besides the slots, it appends n hidden parameters as
// extra EXECUTE arguments, numbered after the slots.
func (p *Plan) AppendExecuteParams(dst []byte, first, n int) []byte {
	return p.render(dst, func(dst []byte, i int) []byte { return appendParam(dst, first+i) },
		n, func(dst []byte, j int) []byte { return appendParam(dst, first+len(p.Slots)+j) })
}

// render copies the SQL text with the edits applied; slot renders the i-th
// slot's value and arg the j-th of the n IDs appended to an EXECUTE.
func (p *Plan) render(dst []byte, slot func([]byte, int) []byte, n int, arg func([]byte, int) []byte) []byte {
	pos := 0
	execDone := p.exec == nil || n == 0
	for _, e := range p.edits {
		if !execDone && p.exec.pos <= e.start {
			dst = append(dst, p.sql[pos:p.exec.pos]...)
			dst = p.appendExecArgs(dst, n, arg)
			pos = p.exec.pos
			execDone = true
		}
		dst = append(dst, p.sql[pos:e.start]...)
		mark := len(dst)
		dst = append(dst, e.text...)
		if e.slot >= 0 {
			dst = slot(dst, e.slot)
		}
		dst = separate(dst, mark, p.sql, e.end)
		pos = e.end
	}
	if !execDone {
		dst = append(dst, p.sql[pos:p.exec.pos]...)
		dst = p.appendExecArgs(dst, n, arg)
		pos = p.exec.pos
	}
	return append(dst, p.sql[pos:]...)
}

func (p *Plan) appendExecArgs(dst []byte, n int, arg func([]byte, int) []byte) []byte {
	if p.exec.hasArgs {
		for j := 0; j < n; j++ {
			dst = append(dst, ", "...)
			dst = arg(dst, j)
		}
		return dst
	}
	dst = append(dst, '(')
	for j := 0; j < n; j++ {
		if j > 0 {
			dst = append(dst, ", "...)
		}
		dst = arg(dst, j)
	}
	return append(dst, ')')
}

// separate keeps the written text dst[mark:] from fusing with its
// neighbours into one token (")END" must not become "1001::int8END"): a
// space goes where an identifier character would touch one.
func separate(dst []byte, mark int, sql string, next int) []byte {
	if mark > 0 && mark < len(dst) && isIdentByte(dst[mark-1]) && isIdentByte(dst[mark]) {
		dst = append(dst[:mark+1], dst[mark:]...)
		dst[mark] = ' '
	}
	if len(dst) > mark && next < len(sql) && isIdentByte(dst[len(dst)-1]) && isIdentByte(sql[next]) {
		dst = append(dst, ' ')
	}
	return dst
}

func isIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$' || c >= 0x80
}

// appendID writes an ID as an int8 literal. The cast keeps the type
// leaf_next() would have had (a small ID alone would be an int4 constant).
func appendID(dst []byte, id int64) []byte {
	if id < 0 {
		dst = append(dst, '(')
		dst = strconv.AppendInt(dst, id, 10)
		return append(dst, ")::int8"...)
	}
	dst = strconv.AppendInt(dst, id, 10)
	return append(dst, "::int8"...)
}

func appendParam(dst []byte, n int) []byte {
	dst = append(dst, '$')
	return strconv.AppendInt(dst, int64(n), 10)
}

// SessionConflict reports whether a string of several statements touches a
// prepared statement the session has hidden parameters for: the proxy cannot
// inject IDs into an EXECUTE inside such a string, and must answer the
// returned 0A000 error instead of forwarding. hasSlots(name) says whether the
// session's statement name has slots; hasSlots("") whether any has. It
// returns nil when the string may be forwarded as it is.
func (p *Plan) SessionConflict(hasSlots func(name string) bool) error {
	for _, r := range p.SessionRefs {
		if hasSlots(r.Name) {
			what := "prepared statement " + strconv.Quote(r.Name)
			if r.All {
				what = "all prepared statements"
			}
			return &Error{Code: sqlstate.FeatureNotSupported,
				Message: "EXECUTE or DEALLOCATE of " + what + " with leaf IDs inside a query of several statements is not supported",
				Hint:    "Send EXECUTE, DEALLOCATE and DISCARD ALL as their own query."}
		}
	}
	return nil
}
