package rewrite

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// planner plans one SQL string. A PREPARE body gets a child planner that
// shares the text and tokens but numbers its own slots.
type planner struct {
	rw    *Rewriter
	sql   string
	toks  tokens
	reads *[]int // locations of the constants whose values the plan depends on; shared with child planners

	edits     []slotEdit
	err       *Error
	leafText  bool           // the text mentions leaf_ at all: otherwise no call can be found
	tagArgs   map[int32]bool // locations of $n used as leaf_next tags
	tagParams map[int]bool   // n used as a leaf_next tag
	refParams map[int]bool   // n referenced anywhere else
	maxParam  int

	prepare    *Prepare
	prepareAny bool // a PREPARE whose body has slots
	execute    *Execute
	exec       *execEdit
	deallocate *Deallocate
	refs       []SessionRef
	copyFill   *CopyFill

	batch       *Batch // a leaf_next(tag, n) call; the plan is a Batch if it is the whole statement
	batchLoc    int
	countParams map[int]bool // n used as the count of leaf_next(tag, n)

	decode    *Decode // a leaf_decode(id) call; refused unless it is the whole statement
	decodeLoc int
}

// slotEdit is an edit before slots are numbered: hasSlot marks the edits
// that receive an ID, described by slot.
type slotEdit struct {
	edit
	hasSlot bool
	slot    Slot
}

func newPlanner(rw *Rewriter, sql string, toks tokens, reads *[]int) *planner {
	return &planner{rw: rw, sql: sql, toks: toks, reads: reads, leafText: containsFold(sql, "leaf_"),
		tagArgs: map[int32]bool{}, tagParams: map[int]bool{}, refParams: map[int]bool{}, countParams: map[int]bool{}}
}

// planned is the outcome of planning one text, with what the shape cache
// needs to know to reuse it for texts that differ only in constants.
type planned struct {
	plan   *Plan
	err    error
	tree   *pg_query.ParseResult // nil when the text does not parse
	consts []int32               // locations of the tree's A_Const nodes
	reads  []int                 // locations of the constants whose values the outcome depends on
}

// plan parses sql and plans it; toks are its tokens without comments.
func plan(rw *Rewriter, sql string, toks tokens) planned {
	if strings.IndexByte(sql, 0) >= 0 {
		// The protocol's strings end at NUL, and so would the C parser's
		// view of the text: locations would not match what is sent.
		return planned{}
	}
	if chainDepth(toks) > maxChainDepth {
		return planned{err: errTooDeep}
	}
	tree, consts, err := parseTree(sql)
	if errors.Is(err, errTooDeep) {
		return planned{err: errTooDeep}
	}
	if err != nil {
		// Not ours to report: PostgreSQL gives the user its own syntax error.
		return planned{}
	}
	var reads []int
	p := newPlanner(rw, sql, toks, &reads)
	out, err := p.plan(tree)
	return planned{plan: out, err: err, tree: tree, consts: consts, reads: reads}
}

// plan plans the statements of tree.
func (p *planner) plan(tree *pg_query.ParseResult) (*Plan, error) {
	sql := p.sql
	for _, raw := range tree.Stmts {
		start, end := int(raw.StmtLocation), len(sql)
		if raw.StmtLen > 0 {
			end = start + int(raw.StmtLen)
		}
		p.statement(raw.Stmt, start, end)
		if strings.IndexByte(sql[start:end], '$') >= 0 {
			p.params(raw.Stmt)
		}
	}
	multi := len(tree.Stmts) > 1
	var batch *Batch
	if p.err == nil && p.batch != nil {
		if !multi && len(p.edits) == 0 {
			batch = p.standaloneBatch(tree.Stmts[0].Stmt)
		}
		if batch == nil {
			p.fail(p.errAt(sqlstate.FeatureNotSupported, p.batchLoc, hintBatch, "leaf_next(tag, n) returns a set of rows and is supported only as a query of its own"))
		}
	}
	if p.err == nil && p.decode != nil && (multi || len(p.edits) != 1 || !p.standaloneDecode(tree.Stmts[0].Stmt)) {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, p.decodeLoc, hintDecode, "leaf_decode() is supported only as a query of its own, SELECT leaf_decode(id)"))
	}
	if p.err != nil {
		return nil, p.err
	}
	if batch != nil {
		return &Plan{sql: sql, MaxParam: p.maxParam, Batch: batch, UnreferencedParams: p.unreferenced()}, nil
	}
	if multi && p.prepareAny {
		return nil, &Error{Code: sqlstate.FeatureNotSupported,
			Message: "PREPARE of a statement with leaf IDs inside a query of several statements is not supported",
			Hint:    "Send the PREPARE as its own query."}
	}
	if multi && p.copyFill != nil {
		return nil, &Error{Code: sqlstate.FeatureNotSupported,
			Message: "COPY … FROM STDIN whose rows the proxy gives keys inside a query of several statements is not supported",
			Hint:    "Send the COPY as its own query."}
	}
	if len(p.edits) == 0 && p.prepare == nil && p.execute == nil && p.deallocate == nil && len(p.refs) == 0 && p.copyFill == nil {
		return nil, nil
	}
	out := &Plan{sql: sql, MaxParam: p.maxParam}
	out.edits, out.Slots = p.number(func(i int) string { return "" })
	pos := 0
	for _, e := range out.edits {
		// Rendering copies the text between edits; overlapping edits would
		// be a planner bug, caught here rather than as a panic in the proxy.
		if e.start < pos || e.end < e.start || e.end > len(sql) {
			return nil, p.errAt(sqlstate.InternalError, e.start, "", "rewrite: overlapping edits")
		}
		pos = e.end
	}
	out.UnreferencedParams = p.unreferenced()
	if multi {
		out.SessionRefs = p.refs
	} else {
		out.Prepare, out.Execute, out.Deallocate, out.exec = p.prepare, p.execute, p.deallocate, p.exec
		if x := out.exec; x != nil {
			for _, e := range out.edits {
				if x.pos > len(sql) || (e.start < x.pos && x.pos < e.end) {
					return nil, p.errAt(sqlstate.InternalError, x.pos, "", "rewrite: EXECUTE arguments overlap an edit")
				}
			}
		}
		out.FastPath = fastPath(tree.Stmts[0].Stmt, out.Slots)
		out.Decode = p.decode
		out.CopyFill = p.copyFill
	}
	return out, nil
}

// unreferenced lists the parameters that only carried a leaf_next tag, sorted.
func (p *planner) unreferenced() []int {
	var out []int
	for n := range p.tagParams {
		if !p.refParams[n] {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

// number sorts the edits by position and numbers the slots in textual
// order. static, when it returns non-empty text for slot i, turns the slot
// into fixed text (the hidden parameters of a PREPARE).
func (p *planner) number(static func(i int) string) ([]edit, []Slot) {
	sort.SliceStable(p.edits, func(i, j int) bool { return p.edits[i].start < p.edits[j].start })
	edits := make([]edit, 0, len(p.edits))
	var slots []Slot
	for _, e := range p.edits {
		e.edit.slot = -1
		if e.hasSlot {
			i := len(slots)
			slots = append(slots, e.slot)
			if s := static(i); s != "" {
				e.edit.text += s
			} else {
				e.edit.slot = i
			}
		}
		edits = append(edits, e.edit)
	}
	return edits, slots
}

// fail records err, keeping the one that comes first in the text so that
// the reported error does not depend on walk order.
func (p *planner) fail(err *Error) {
	if p.err == nil || (err.Position > 0 && (p.err.Position == 0 || err.Position < p.err.Position)) {
		p.err = err
	}
}

// errAt builds an error positioned at byte offset loc, reported as
// PostgreSQL does: a 1-based character position.
func (p *planner) errAt(code string, loc int, hint, format string, args ...any) *Error {
	e := &Error{Code: code, Message: fmt.Sprintf(format, args...), Hint: hint}
	if loc >= 0 && loc <= len(p.sql) {
		e.Position = utf8.RuneCountInString(p.sql[:loc]) + 1
	}
	return e
}

func (p *planner) internal(loc int, what string) {
	p.fail(p.errAt(sqlstate.InternalError, loc, "", "rewrite: cannot locate %s in the statement text", what))
}

func (p *planner) tokens() tokens { return p.toks }

// read records that the plan depends on the value of the constant at loc,
// so that the shape cache keys plans on that constant's exact text.
func (p *planner) read(loc int32) { *p.reads = append(*p.reads, int(loc)) }

func (p *planner) add(e slotEdit) { p.edits = append(p.edits, e) }

// statement plans one top-level statement (or a PREPARE or EXPLAIN body).
func (p *planner) statement(n *pg_query.Node, start, end int) {
	switch s := unwrap(n).(type) {
	case *pg_query.SelectStmt:
		p.selectStmt(s, true)
	case *pg_query.InsertStmt:
		p.insert(s)
	case *pg_query.CallStmt:
		if s.Funccall != nil {
			p.refuse(s.Funccall, "a CALL", "args")
			for _, a := range s.Funccall.Args {
				p.once(a)
			}
		}
	case *pg_query.ExecuteStmt:
		p.executeStmt(s, start, end)
	case *pg_query.PrepareStmt:
		p.prepareStmt(s, start, end)
	case *pg_query.DeallocateStmt:
		p.deallocate = &Deallocate{Name: s.Name, All: s.Isall}
		p.refs = append(p.refs, SessionRef{Name: s.Name, All: s.Isall})
	case *pg_query.DiscardStmt:
		if s.Target == pg_query.DiscardMode_DISCARD_ALL {
			p.deallocate = &Deallocate{All: true}
			p.refs = append(p.refs, SessionRef{All: true})
		}
	case *pg_query.ExplainStmt:
		// EXPLAIN ANALYZE runs the statement once; a plain EXPLAIN only
		// wastes the IDs, which is harmless.
		p.statement(s.Query, start, end)
	case *pg_query.CreateTableAsStmt:
		if ex := s.Query.GetExecuteStmt(); ex != nil {
			p.executeStmt(ex, start, end)
			return
		}
		p.refuse(s, "CREATE TABLE … AS")
	case *pg_query.CopyStmt:
		if ins := s.Query.GetInsertStmt(); ins != nil {
			p.insert(ins) // COPY (INSERT … RETURNING …) TO runs the INSERT once
			return
		}
		p.refuse(s, "COPY")
		p.copyFrom(s)
	case *pg_query.UpdateStmt:
		p.with(s.WithClause)
		p.refuse(s, "UPDATE", "with_clause")
	case *pg_query.DeleteStmt:
		p.with(s.WithClause)
		p.refuse(s, "DELETE", "with_clause")
	case *pg_query.MergeStmt:
		p.with(s.WithClause)
		p.merge(s)
		p.refuse(s, "MERGE", "with_clause")
	case nil:
	default:
		p.refuse(s, statementName(s))
	}
}

// statementName names a statement kind for an error message.
func statementName(m proto.Message) string {
	name := string(m.ProtoReflect().Descriptor().Name())
	switch name {
	case "DeclareCursorStmt":
		return "DECLARE CURSOR"
	case "CreateTrigStmt", "CreateFunctionStmt":
		return "a function or trigger definition"
	}
	switch {
	case strings.HasPrefix(name, "Create"), strings.HasPrefix(name, "Alter"), strings.HasPrefix(name, "Define"), name == "ViewStmt", name == "RuleStmt":
		return "DDL (" + name + ")"
	}
	return name
}

// with plans a WITH clause: data-modifying INSERTs run exactly once, every
// other CTE may run per row.
func (p *planner) with(w *pg_query.WithClause) {
	if w == nil {
		return
	}
	for _, c := range w.Ctes {
		cte := c.GetCommonTableExpr()
		if cte == nil {
			continue
		}
		if ins := cte.Ctequery.GetInsertStmt(); ins != nil {
			p.insert(ins)
			continue
		}
		p.refuse(cte, "a WITH query")
	}
}

// selectStmt plans a SELECT that runs once as a whole: a top-level query
// or an arm of a top-level set operation.
func (p *planner) selectStmt(s *pg_query.SelectStmt, top bool) {
	if top {
		p.with(s.WithClause)
	} else if s.WithClause != nil {
		p.refuse(s.WithClause, "a WITH query")
	}
	switch {
	case s.Op != pg_query.SetOperation_SETOP_NONE:
		p.selectStmt(s.Larg, false)
		p.selectStmt(s.Rarg, false)
		p.refuse(s, "ORDER BY or LIMIT", "with_clause", "larg", "rarg")
	case len(s.ValuesLists) > 0:
		for _, row := range s.ValuesLists {
			for _, item := range row.GetList().GetItems() {
				p.once(item)
			}
		}
		p.refuse(s, "ORDER BY or LIMIT", "with_clause", "values_lists")
	case len(s.FromClause) > 0:
		p.refuse(s, "a SELECT with FROM", "with_clause")
	default:
		p.targets(s)
		p.refuse(s.WhereClause, "WHERE")
		p.refuse(s.HavingClause, "HAVING")
		p.refuse(s, "GROUP BY, ORDER BY, LIMIT or DISTINCT ON", "with_clause", "target_list", "where_clause", "having_clause")
	}
}

// targets plans the target list of a SELECT without FROM, which PostgreSQL
// evaluates once, unless a set-returning function multiplies the rows.
func (p *planner) targets(s *pg_query.SelectStmt) {
	before := len(p.edits)
	for _, t := range s.TargetList {
		rt := t.GetResTarget()
		if rt == nil || rt.Val == nil {
			continue
		}
		n := len(p.edits)
		p.once(rt.Val)
		if len(p.edits) == n || rt.Name != "" {
			continue
		}
		// The ID replaces the call, so keep the column name PostgreSQL
		// would have derived from it.
		name, _ := figureColname(rt.Val, false)
		if alt, _ := figureColname(rt.Val, true); name == alt || name == "" {
			continue
		}
		end := p.tokens().exprEnd(int(rt.Location))
		p.add(slotEdit{edit: edit{start: end, end: end, text: " AS " + quoteIdent(name)}})
	}
	if len(p.edits) == before {
		return
	}
	for _, t := range s.TargetList {
		walk(t, func(m proto.Message) bool {
			if fc, ok := m.(*pg_query.FuncCall); ok && len(fc.Funcname) > 0 {
				if name := fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval(); setReturning[name] {
					p.fail(p.errAt(sqlstate.FeatureNotSupported, int(fc.Location), hintOnce,
						"leaf_next() and leaf_snowflake() cannot be used next to the set-returning function %s()", name))
				}
			}
			return true
		})
	}
}

// once plans an expression PostgreSQL evaluates once per execution: each
// leaf_* call in it becomes a slot; subqueries inside it are refused.
func (p *planner) once(n *pg_query.Node) {
	if !p.leafText {
		return // no leaf_* call anywhere in the text
	}
	visit := func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg_query.FuncCall:
			if leafFunc(x) != "" {
				p.leafCall(x)
				return false
			}
			if isDecode(x) {
				p.decodeCall(x)
				return false
			}
		case *pg_query.SubLink:
			if x.Testexpr != nil {
				p.once(x.Testexpr)
			}
			p.refuse(x, "a subquery", "testexpr")
			return false
		}
		return true
	}
	if m := unwrap(n); m != nil && visit(m) {
		walk(m, visit)
	}
}

// refuse walks m (without the fields in skip) for leaf_* calls and INSERTs
// that would need an ID where PostgreSQL does not evaluate them once.
func (p *planner) refuse(m proto.Message, where string, skip ...string) {
	if m == nil || (!p.leafText && len(p.rw.fill) == 0) {
		return
	}
	visit := func(c proto.Message) bool {
		switch x := c.(type) {
		case *pg_query.FuncCall:
			if isDecode(x) {
				p.fail(p.errAt(sqlstate.FeatureNotSupported, int(x.Location), hintDecode, "leaf_decode() is not supported in %s", where))
				return false
			}
			if name := leafFunc(x); name != "" {
				if name == "leaf_next" && len(x.Args) == 2 {
					p.fail(p.errAt(sqlstate.FeatureNotSupported, int(x.Location), hintBatch, "leaf_next(tag, n) returns a set of rows and is not supported in %s", where))
					return false
				}
				p.fail(p.errAt(sqlstate.FeatureNotSupported, int(x.Location), hintOnce, "%s() is not supported in %s", name, where))
				return false
			}
		case *pg_query.InsertStmt:
			if rule, loc := p.needsFill(x); rule != nil {
				p.fail(p.errAt(sqlstate.FeatureNotSupported, loc, "The proxy fills "+ruleName(rule.FillRule)+" only in a top-level INSERT … VALUES or a WITH (INSERT …) at the top level.",
					"INSERT into %s inside %s cannot get its %s filled", x.Relation.Relname, where, rule.Column))
			}
		}
		return true
	}
	m = unwrap(m)
	if isNil(m) {
		return
	}
	if visit(m) {
		walk(m, visit, skip...)
	}
}
