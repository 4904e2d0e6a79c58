package rewrite

import (
	"strconv"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// leafCall turns one leaf_next/leaf_snowflake call into a slot replacing
// the whole call text.
func (p *planner) leafCall(fc *pg_query.FuncCall) {
	name := leafFunc(fc)
	loc := int(fc.Location)
	if fc.AggStar || fc.AggDistinct || len(fc.AggOrder) > 0 || fc.AggFilter != nil || fc.Over != nil || fc.FuncVariadic || fc.AggWithinGroup {
		p.fail(p.errAt(sqlstate.InvalidParameterValue, loc, "", "%s() is not an aggregate or window function", name))
		return
	}
	var slot Slot
	switch name {
	case "leaf_snowflake":
		if len(fc.Args) != 0 {
			p.fail(p.errAt(sqlstate.InvalidParameterValue, loc, "Call it as leaf_snowflake().", "leaf_snowflake() takes no arguments"))
			return
		}
		slot = Slot{Kind: SlotSnowflake}
	default:
		if len(fc.Args) == 2 {
			p.batchCall(fc)
			return
		}
		if len(fc.Args) != 1 {
			p.fail(p.errAt(sqlstate.InvalidParameterValue, loc, "Call it as leaf_next('tag'), or leaf_next('tag', n) for n IDs.", "leaf_next() takes the tag, or the tag and a number of IDs"))
			return
		}
		var ok bool
		if slot, ok = p.tagArg(fc.Args[0], loc); !ok {
			return
		}
	}
	toks := p.tokens()
	i := toks.at(loc)
	k := toks.matchParen(i + 1)
	if i >= len(toks) || int(toks[i].Start) != loc || k < 0 {
		p.internal(loc, name+"()")
		return
	}
	p.add(slotEdit{edit: edit{start: loc, end: int(toks[k].End)}, hasSlot: true, slot: slot})
}

// tagArg reads the tag of leaf_next: a non-empty string literal or a
// parameter, either possibly cast to a string type.
func (p *planner) tagArg(n *pg_query.Node, callLoc int) (Slot, bool) {
	const hint = "Pass the tag as a string literal, leaf_next('order'), or as a parameter, leaf_next($1)."
	switch x := unwrap(n).(type) {
	case *pg_query.A_Const:
		p.read(x.Location)
		switch {
		case x.Isnull:
			p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hint, "the tag of leaf_next() must not be NULL"))
		case x.GetSval() == nil:
			p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hint, "the tag of leaf_next() must be a string"))
		case x.GetSval().Sval == "":
			p.fail(p.errAt(sqlstate.InvalidParameterValue, int(x.Location), hint, "the tag of leaf_next() must not be empty"))
		default:
			return Slot{Kind: SlotTag, Tag: x.GetSval().Sval}, true
		}
		return Slot{}, false
	case *pg_query.ParamRef:
		p.tagArgs[x.Location] = true
		p.tagParams[int(x.Number)] = true
		return Slot{Kind: SlotTagParam, Param: int(x.Number)}, true
	case *pg_query.TypeCast:
		if isStringType(x.TypeName) {
			return p.tagArg(x.Arg, callLoc)
		}
	}
	p.fail(p.errAt(sqlstate.InvalidParameterValue, callLoc, hint, "the tag of leaf_next() must be a string literal or a parameter"))
	return Slot{}, false
}

func isStringType(t *pg_query.TypeName) bool {
	if t == nil || len(t.Names) == 0 || len(t.ArrayBounds) > 0 {
		return false
	}
	switch t.Names[len(t.Names)-1].GetString_().GetSval() {
	case "text", "varchar", "bpchar", "name":
		return true
	}
	return false
}

// stringConst returns the value of a string literal, possibly cast, and
// records that the plan depends on it.
func (p *planner) stringConst(n *pg_query.Node) (string, bool) {
	switch x := unwrap(n).(type) {
	case *pg_query.A_Const:
		if s := x.GetSval(); s != nil && !x.Isnull {
			p.read(x.Location)
			return s.Sval, true
		}
	case *pg_query.TypeCast:
		if isStringType(x.TypeName) {
			return p.stringConst(x.Arg)
		}
	}
	return "", false
}

// paramArg returns the parameter an argument is, possibly cast.
func paramArg(n *pg_query.Node) *pg_query.ParamRef {
	switch x := unwrap(n).(type) {
	case *pg_query.ParamRef:
		return x
	case *pg_query.TypeCast:
		return paramArg(x.Arg)
	}
	return nil
}

// executeStmt records an EXECUTE: its arguments are evaluated once, and the
// IDs of the prepared statement's slots go after them.
func (p *planner) executeStmt(s *pg_query.ExecuteStmt, start, end int) {
	for _, a := range s.Params {
		p.once(a)
	}
	ex := &Execute{Name: s.Name, Args: make([]Arg, len(s.Params))}
	for i, a := range s.Params {
		ex.Args[i].Value, ex.Args[i].String = p.stringConst(a)
		if pr := paramArg(a); pr != nil {
			ex.Args[i].Param = int(pr.Number)
		}
	}
	p.execute = ex
	p.refs = append(p.refs, SessionRef{Name: s.Name})
	// EXPLAIN and CREATE TABLE AS may precede it: take the last EXECUTE
	// keyword at depth 0 that is followed by the statement's name.
	// A name spelled with Unicode escapes (U&"…") does not compare equal
	// to its token text; then the last EXECUTE followed by a name is it.
	toks := p.tokens()
	name, fallback := -1, -1
	depth := 0
	for j := toks.at(start); j+1 < len(toks) && int(toks[j].Start) < end; j++ {
		switch toks[j].Token {
		case pg_query.Token_ASCII_40:
			depth++
		case pg_query.Token_ASCII_41:
			depth--
		case pg_query.Token_EXECUTE:
			if depth != 0 {
				continue
			}
			if toks.identAt(p.sql, j+1) == s.Name {
				name = j + 1
			}
			if next := toks[j+1].Token; next != pg_query.Token_AS && next != pg_query.Token_ASCII_40 {
				fallback = j + 1
			}
		}
	}
	if name < 0 {
		name = fallback
	}
	if name < 0 {
		p.internal(start, "the EXECUTE name")
		return
	}
	if len(s.Params) == 0 {
		p.exec = &execEdit{pos: int(toks[name].End)}
		return
	}
	k := toks.matchParen(name + 1)
	if k < 0 {
		p.internal(int(toks[name].Start), "the EXECUTE arguments")
		return
	}
	p.exec = &execEdit{pos: int(toks[k].Start), hasArgs: true}
}

// prepareStmt plans PREPARE name [(types)] AS body. The body's slots become
// int8 parameters declared after the statement's own, so that each EXECUTE
// supplies fresh IDs as extra arguments.
func (p *planner) prepareStmt(s *pg_query.PrepareStmt, start, end int) {
	sub := newPlanner(p.rw, p.sql, p.toks, p.reads)
	sub.statement(s.Query, start, end)
	if strings.IndexByte(p.sql[start:end], '$') >= 0 {
		sub.params(s.Query)
	}
	if sub.err != nil {
		p.fail(sub.err)
		return
	}
	if sub.decode != nil {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, sub.decodeLoc, hintDecode, "leaf_decode() is not supported in PREPARE"))
		return
	}
	if sub.batch != nil {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, sub.batchLoc, "Prepare SELECT leaf_next($1, $2) with the extended query protocol (a driver's prepared statement) instead.",
			"leaf_next(tag, n) returns a set of rows and is not supported in PREPARE"))
		return
	}
	hasSlots := false
	for _, e := range sub.edits {
		hasSlots = hasSlots || e.hasSlot
	}
	if !hasSlots {
		return // a plain PREPARE: nothing to rewrite or remember
	}
	base := max(len(s.Argtypes), sub.maxParam)
	edits, slots := sub.number(func(i int) string { return "$" + strconv.Itoa(base+1+i) })
	var types []string
	for n := len(s.Argtypes) + 1; n <= base; n++ {
		if sub.tagParams[n] && !sub.refParams[n] {
			types = append(types, "text") // nothing else would give it a type
		} else {
			types = append(types, "unknown") // inferred, as when left out
		}
	}
	for range slots {
		types = append(types, "int8")
	}
	list := strings.Join(types, ", ")
	toks := p.tokens()
	i := toks.at(start)
	if !toks.is(i, pg_query.Token_PREPARE) || i+1 >= len(toks) {
		p.internal(start, "PREPARE")
		return
	}
	name := i + 1
	if len(s.Argtypes) > 0 {
		k := toks.matchParen(name + 1)
		if k < 0 {
			p.internal(int(toks[name].Start), "the PREPARE parameter types")
			return
		}
		at := int(toks[k].Start)
		p.add(slotEdit{edit: edit{start: at, end: at, text: ", " + list}})
	} else {
		at := int(toks[name].End)
		p.add(slotEdit{edit: edit{start: at, end: at, text: " (" + list + ")"}})
	}
	for _, e := range edits {
		p.add(slotEdit{edit: e})
	}
	p.prepare = &Prepare{Name: s.Name, Slots: slots}
	p.prepareAny = true
}

// params records the $n references of a statement; a PREPARE body numbers
// its own parameters and is skipped.
func (p *planner) params(n *pg_query.Node) {
	visit := func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg_query.PrepareStmt:
			return false
		case *pg_query.ParamRef:
			num := int(x.Number)
			p.maxParam = max(p.maxParam, num)
			if !p.tagArgs[x.Location] {
				p.refParams[num] = true
			}
		}
		return true
	}
	if m := unwrap(n); m != nil && visit(m) {
		walk(m, visit)
	}
}

// fastPath recognises a query that is exactly one bare SELECT of a leaf
// function with a literal tag.
func fastPath(stmt *pg_query.Node, slots []Slot) *FastPath {
	s := stmt.GetSelectStmt()
	if s == nil || len(slots) != 1 || slots[0].Kind == SlotTagParam || len(s.TargetList) != 1 ||
		s.Op != pg_query.SetOperation_SETOP_NONE || s.WithClause != nil || len(s.FromClause) > 0 ||
		s.WhereClause != nil || len(s.GroupClause) > 0 || s.HavingClause != nil || len(s.WindowClause) > 0 ||
		len(s.ValuesLists) > 0 || len(s.SortClause) > 0 || s.LimitCount != nil || s.LimitOffset != nil ||
		len(s.LockingClause) > 0 || len(s.DistinctClause) > 0 || s.IntoClause != nil {
		return nil
	}
	rt := s.TargetList[0].GetResTarget()
	fc := rt.GetVal().GetFuncCall()
	if fc == nil || leafFunc(fc) == "" {
		return nil
	}
	col := rt.Name
	if col == "" {
		col = leafFunc(fc)
	}
	return &FastPath{Column: col, Slot: slots[0]}
}
