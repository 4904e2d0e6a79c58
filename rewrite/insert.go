package rewrite

import (
	"slices"
	"strconv"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// rules returns the fill rules for an INSERT, COPY or MERGE target.
func (r *Rewriter) rules(rel *pg_query.RangeVar) []fillRule {
	if rel == nil || len(r.fill) == 0 {
		return nil
	}
	schema := r.schemaOf(rel)
	var out []fillRule
	for _, f := range r.fill {
		if f.Table == rel.Relname && (f.Schema == "" || f.Schema == schema) {
			f.max = r.keyMax(rel, f)
			out = append(out, f)
		}
	}
	return out
}

// schemaOf returns the schema a target is planned by: its qualifier, or for an
// unqualified name the one schema the catalog knows to hold a table of that name (the
// search_path can reach no other), else "".
func (r *Rewriter) schemaOf(rel *pg_query.RangeVar) string {
	if rel.Schemaname != "" || r.catalog == nil {
		return rel.Schemaname
	}
	if s := r.catalog.Schemas(rel.Relname); len(s) == 1 {
		return s[0]
	}
	return ""
}

// ambiguous returns, for an unqualified target, the schemas holding a table of its name
// and the rules that fill the table of one of them, when there are others: which one the
// session's search_path reaches the proxy cannot tell. Nil otherwise.
func (r *Rewriter) ambiguous(rel *pg_query.RangeVar) (schemas []string, rules []fillRule) {
	if rel == nil || rel.Schemaname != "" || r.catalog == nil {
		return nil, nil
	}
	for _, f := range r.fill {
		if f.Schema == "" || f.Table != rel.Relname {
			continue
		}
		if schemas == nil {
			if schemas = r.catalog.Schemas(rel.Relname); len(schemas) < 2 {
				return nil, nil
			}
		}
		if slices.Contains(schemas, f.Schema) {
			rules = append(rules, f)
		}
	}
	if rules == nil {
		return nil, nil
	}
	return schemas, rules
}

// rules returns the fill rules for an INSERT, COPY or MERGE target. When the target's
// name is unqualified and may reach a filled table or another of the same name (see
// Rewriter.ambiguous), the plan fails (0A000) if the statement needs a key of such a
// table filled (needs, given the key column; nil when it always would); otherwise only
// the rules that name no schema apply.
func (p *planner) rules(rel *pg_query.RangeVar, needs func(column string) bool) []fillRule {
	schemas, amb := p.rw.ambiguous(rel)
	if slices.ContainsFunc(amb, func(f fillRule) bool { return needs == nil || needs(f.Column) }) {
		names := make([]string, len(schemas))
		for i, s := range schemas {
			names[i] = quoteIdent(s) + "." + quoteIdent(rel.Relname)
		}
		p.fail(p.errAt(sqlstate.FeatureNotSupported, int(rel.Location),
			"Qualify the name with its schema ("+strings.Join(names, " or ")+"): the proxy fills one of these tables, and cannot tell which one the search_path reaches.",
			"%s is not qualified with a schema, and more than one schema has a table of that name", rel.Relname))
		return nil
	}
	return p.rw.rules(rel)
}

// table asks the catalog for the columns of an INSERT or COPY target, by its name as
// written (schema "" when unqualified), or by the schema an unqualified name can only
// mean (see schemaOf).
func (r *Rewriter) table(rel *pg_query.RangeVar) (Table, bool) {
	if r.catalog == nil {
		return Table{}, false
	}
	return r.catalog.Table(r.schemaOf(rel), rel.Relname)
}

// keyPosition returns the 0-based position of the rule's column among the
// table's columns, -1 when the catalog does not know it.
func (r *Rewriter) keyPosition(rel *pg_query.RangeVar, rule fillRule) int {
	t, ok := r.table(rel)
	if !ok {
		return -1
	}
	for i, c := range t.Columns {
		if c == rule.Column {
			return i
		}
	}
	return -1
}

// keyMax returns the largest ID the rule's key column holds by its type in
// the catalog, 0 for bigint or an unknown type.
func (r *Rewriter) keyMax(rel *pg_query.RangeVar, rule fillRule) int64 {
	t, ok := r.table(rel)
	if !ok {
		return 0
	}
	for i, c := range t.Columns {
		if c == rule.Column && i < len(t.Types) {
			return maxForType(t.Types[i])
		}
	}
	return 0
}

// insert plans an INSERT that runs once: its VALUES rows are evaluated once
// each, and fill rules add or replace the key column.
func (p *planner) insert(ins *pg_query.InsertStmt) {
	p.with(ins.WithClause)
	sel := ins.SelectStmt.GetSelectStmt()
	values := sel != nil && len(sel.ValuesLists) > 0 && sel.Op == pg_query.SetOperation_SETOP_NONE
	switch {
	case values:
		for _, row := range sel.ValuesLists {
			for _, item := range row.GetList().GetItems() {
				p.once(item)
			}
		}
		p.refuse(sel, "ORDER BY or LIMIT of VALUES", "values_lists")
	case ins.SelectStmt != nil:
		p.refuse(ins.SelectStmt, "INSERT … SELECT")
	}
	p.refuse(ins.OnConflictClause, "ON CONFLICT")
	for _, r := range ins.ReturningList {
		p.refuse(r, "RETURNING")
	}
	rules := p.rules(ins.Relation, func(col string) bool { return !hasValueFor(ins.Cols, ins.SelectStmt, col) })
	if len(rules) == 0 {
		return
	}
	relLoc := int(ins.Relation.Location)
	if ins.SelectStmt == nil {
		p.defaultValues(ins, rules)
		return
	}
	var closes []int // token indexes of the ")" ending each VALUES row, found on first use
	named := false   // the column list the catalog gives is added (an INSERT without one)
	for _, rule := range rules {
		idx := columnIndex(ins.Cols, rule.Column)
		switch {
		case !values:
			if idx < 0 {
				p.fail(p.errAt(sqlstate.FeatureNotSupported, relLoc,
					"List "+rule.colSQL+" with a value in the SELECT, or use INSERT … VALUES so that the proxy can fill it.",
					"INSERT … SELECT into %s without %s is not supported: the proxy fills %s only in INSERT … VALUES", ins.Relation.Relname, rule.Column, rule.Column))
			}
		case len(ins.Cols) == 0:
			pos := p.rw.keyPosition(ins.Relation, rule)
			if pos < 0 {
				p.fail(p.errAt(sqlstate.FeatureNotSupported, relLoc,
					"Name the columns, e.g. INSERT INTO "+ins.Relation.Relname+" (col, …) VALUES (…): the catalog does not tell the proxy where "+rule.colSQL+" goes (it does not have the table yet, or the table's columns differ between schemas or databases).",
					"INSERT into %s without a column list is not supported: the proxy fills %s", ins.Relation.Relname, rule.Column))
				continue
			}
			for _, row := range sel.ValuesLists {
				if len(row.GetList().GetItems()) <= pos {
					p.fail(p.errAt(sqlstate.FeatureNotSupported, relLoc,
						"Give every row a value for "+rule.colSQL+" (DEFAULT lets the proxy fill it), or name the columns.",
						"INSERT into %s without a column list gives a row no value for %s, which the proxy fills", ins.Relation.Relname, rule.Column))
					break
				}
			}
			if p.replaceDefaults(sel, pos, rule) && !named {
				named = true
				p.nameColumns(ins, sel)
			}
		case idx >= 0:
			p.replaceDefaults(sel, idx, rule)
		default:
			if closes == nil {
				if closes = p.rowCloses(sel); closes == nil {
					return
				}
			}
			p.addColumn(ins, closes, rule)
		}
	}
}

func columnIndex(cols []*pg_query.Node, name string) int {
	for i, c := range cols {
		if rt := c.GetResTarget(); rt != nil && rt.Name == name {
			return i
		}
	}
	return -1
}

// isDefaultOrNull reports whether a VALUES item is DEFAULT or a literal NULL.
func isDefaultOrNull(n *pg_query.Node) (int, bool) {
	switch x := unwrap(n).(type) {
	case *pg_query.SetToDefault:
		return int(x.Location), true
	case *pg_query.A_Const:
		if x.Isnull {
			return int(x.Location), true
		}
	}
	return 0, false
}

// replaceDefaults gives every row whose key is DEFAULT or NULL an ID, and reports
// whether one got one.
func (p *planner) replaceDefaults(sel *pg_query.SelectStmt, idx int, rule fillRule) bool {
	toks := p.tokens()
	filled := false
	for _, row := range sel.ValuesLists {
		items := row.GetList().GetItems()
		if idx >= len(items) {
			continue // PostgreSQL rejects the row count mismatch itself
		}
		loc, ok := isDefaultOrNull(items[idx])
		if !ok {
			continue
		}
		i := toks.at(loc)
		if i >= len(toks) || int(toks[i].Start) != loc {
			p.internal(loc, "DEFAULT")
			return false
		}
		p.add(slotEdit{edit: edit{start: loc, end: int(toks[i].End)}, hasSlot: true, slot: Slot{Kind: SlotTag, Tag: rule.Tag, Max: rule.max}})
		filled = true
	}
	return filled
}

// nameColumns gives an INSERT … VALUES without a column list, into which the proxy puts
// IDs by the catalog's column order, that order as its column list: (c1, …, cN) for rows
// of N values. The catalog is read once a minute; should the table's columns have changed
// since (a column dropped before the key moves it), the statement then fails on a column
// that no longer exists, or puts each value into the column of the name the proxy planned
// it for, instead of putting an ID into whatever column now has the key's old place.
func (p *planner) nameColumns(ins *pg_query.InsertStmt, sel *pg_query.SelectStmt) {
	t, ok := p.rw.table(ins.Relation)
	n := len(sel.ValuesLists[0].GetList().GetItems())
	if !ok || n > len(t.Columns) {
		return // PostgreSQL refuses more values than columns itself
	}
	toks := p.tokens()
	v := p.valuesKeyword(sel)
	if v < 0 {
		return
	}
	// INSERT INTO t [AS a] [(columns)] [OVERRIDING SYSTEM|USER VALUE] VALUES …
	at := v
	if v >= 3 && toks[v-3].Token == pg_query.Token_OVERRIDING && toks[v-1].Token == pg_query.Token_VALUE_P {
		at = v - 3
	}
	names := make([]string, n)
	for i, c := range t.Columns[:n] {
		names[i] = quoteIdent(c)
	}
	start := int(toks[at].Start)
	p.add(slotEdit{edit: edit{start: start, end: start, text: "(" + strings.Join(names, ", ") + ") "}})
}

// addColumn appends the key column to the column list and an ID to every row.
func (p *planner) addColumn(ins *pg_query.InsertStmt, closes []int, rule fillRule) {
	toks := p.tokens()
	last := ins.Cols[len(ins.Cols)-1].GetResTarget()
	c := toks.closeAtDepth0(toks.at(int(last.Location)))
	if c < 0 {
		p.internal(int(last.Location), "the end of the column list")
		return
	}
	at := int(toks[c].Start)
	p.add(slotEdit{edit: edit{start: at, end: at, text: ", " + rule.colSQL}})
	for _, k := range closes {
		at := int(toks[k].Start)
		p.add(slotEdit{edit: edit{start: at, end: at, text: ", "}, hasSlot: true, slot: Slot{Kind: SlotTag, Tag: rule.Tag, Max: rule.max}})
	}
}

// valuesKeyword returns the token index of the VALUES keyword of an INSERT's rows: the
// last one before the first location inside the rows; -1 (an internal error) when there
// is none.
func (p *planner) valuesKeyword(sel *pg_query.SelectStmt) int {
	toks := p.tokens()
	first := minLocation(sel.ValuesLists)
	i := toks.at(first) - 1
	for i >= 0 && toks[i].Token != pg_query.Token_VALUES {
		i--
	}
	if first < 0 || i < 0 {
		p.internal(first, "the VALUES rows")
		return -1
	}
	return i
}

// rowCloses returns the token index of the ")" that ends each VALUES row.
// The rows start right after the VALUES keyword.
func (p *planner) rowCloses(sel *pg_query.SelectStmt) []int {
	toks := p.tokens()
	i := p.valuesKeyword(sel)
	if i < 0 {
		return nil
	}
	closes := make([]int, 0, len(sel.ValuesLists))
	j := i + 1
	for r := range sel.ValuesLists {
		k := toks.matchParen(j)
		if k < 0 {
			p.internal(int(toks[i].Start), "a VALUES row")
			return nil
		}
		closes = append(closes, k)
		j = k + 1
		if r < len(sel.ValuesLists)-1 {
			if !toks.is(j, pg_query.Token_ASCII_44) {
				p.internal(int(toks[k].Start), "the next VALUES row")
				return nil
			}
			j++
		}
	}
	if toks.is(j, pg_query.Token_ASCII_44) {
		p.internal(int(toks[i].Start), "the last VALUES row")
		return nil
	}
	return closes
}

// defaultValues turns INSERT … DEFAULT VALUES into (key, …) VALUES (id, …).
func (p *planner) defaultValues(ins *pg_query.InsertStmt, rules []fillRule) {
	toks := p.tokens()
	relLoc := int(ins.Relation.Location)
	d := toks.findAtDepth0(toks.at(relLoc), len(p.sql), pg_query.Token_DEFAULT)
	if d < 0 || !toks.is(d+1, pg_query.Token_VALUES) {
		p.internal(relLoc, "DEFAULT VALUES")
		return
	}
	start, end := int(toks[d].Start), int(toks[d+1].End)
	cols := "("
	for i, r := range rules {
		if i > 0 {
			cols += ", "
		}
		cols += r.colSQL
	}
	cols += ") VALUES ("
	for i, r := range rules {
		e := slotEdit{edit: edit{start: end, end: end, text: ", "}, hasSlot: true, slot: Slot{Kind: SlotTag, Tag: r.Tag, Max: r.max}}
		if i == 0 {
			e.start, e.text = start, cols
		}
		p.add(e)
	}
	p.add(slotEdit{edit: edit{start: end, end: end, text: ")"}})
}

// needsFill reports the first fill rule an INSERT nested in a refused
// context would need, and where to point the error.
func (p *planner) needsFill(ins *pg_query.InsertStmt) (*fillRule, int) {
	rules := p.rules(ins.Relation, func(col string) bool { return !hasValueFor(ins.Cols, ins.SelectStmt, col) })
	for i := range rules {
		if !hasValueFor(ins.Cols, ins.SelectStmt, rules[i].Column) {
			return &rules[i], int(ins.Relation.Location)
		}
	}
	return nil, 0
}

// hasValueFor reports whether an INSERT's column list and source give col a
// value the proxy need not replace.
func hasValueFor(cols []*pg_query.Node, src *pg_query.Node, col string) bool {
	idx := columnIndex(cols, col)
	if idx < 0 || src == nil {
		return false
	}
	if sel := src.GetSelectStmt(); sel != nil {
		for _, row := range sel.ValuesLists {
			if items := row.GetList().GetItems(); idx < len(items) {
				if _, ok := isDefaultOrNull(items[idx]); ok {
					return false
				}
			}
		}
	}
	return true
}

// copyFrom plans a COPY … FROM into a filled table whose column list leaves
// a key out. From STDIN the proxy adds the key to the column list and an ID to
// every row of the data stream (CopyFill): a binary tuple says where it ends
// and how many fields it has, and the rows of text and CSV data are found by
// PostgreSQL's own rules, so the proxy reads the stream exactly. Any other
// COPY FROM is refused, since its rows would take the key from the column's
// default (a sequence that knows nothing of the IDs the proxy hands out) or
// fail on NOT NULL part way through the load. A COPY without a column list
// into a filled table is refused too: the proxy would have to know where the
// key is in every row, and a client that sends keys would collide with it.
func (p *planner) copyFrom(c *pg_query.CopyStmt) {
	if !c.IsFrom {
		return
	}
	rules := p.rules(c.Relation, func(col string) bool { return !columnName(c.Attlist, col) })
	if len(c.Attlist) == 0 {
		for _, rule := range rules {
			p.fail(p.errAt(sqlstate.FeatureNotSupported, int(c.Relation.Location),
				"List the columns, e.g. COPY "+c.Relation.Relname+" (col, …) FROM STDIN, leaving "+rule.colSQL+" out: the proxy then adds it to every row.",
				"COPY into %s without a column list is not supported: the proxy fills %s", c.Relation.Relname, rule.Column))
		}
		return
	}
	var missing []fillRule
	for _, rule := range rules {
		if !columnName(c.Attlist, rule.Column) {
			missing = append(missing, rule)
		}
	}
	if len(missing) == 0 {
		return
	}
	format, encoding := copyOptions(c)
	if enc := encoding; enc != "" && UnsafeCopyEncoding(enc) {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, int(c.Relation.Location),
			"Load the data in UTF8 or another encoding in which ASCII bytes are always ASCII characters.",
			"COPY into %s in ENCODING %s is not supported: in that encoding the proxy cannot find the rows to give keys to", c.Relation.Relname, enc))
		return
	}
	if c.Filename == "" && !c.IsProgram {
		switch format.Kind {
		case "binary", "text", "csv":
			p.addCopyKeys(c, missing, format)
			return
		}
	}
	for _, rule := range missing {
		p.fail(p.errAt(sqlstate.FeatureNotSupported, int(c.Relation.Location),
			"List "+rule.colSQL+" in the column list and give every row an ID (from SELECT leaf_next('"+strings.ReplaceAll(rule.Tag, "'", "''")+"') or the HTTP API), load with INSERT … VALUES, or use COPY … FROM STDIN (psql's \\copy, pgx's CopyFrom) with a bigint key: the proxy fills the key in those.",
			"COPY into %s without %s is not supported: the proxy fills %s only in INSERT … VALUES and in COPY … FROM STDIN", c.Relation.Relname, rule.Column, rule.Column))
	}
}

// copyOptions reads the options of a COPY that decide how its rows are found, with
// PostgreSQL's defaults, and its ENCODING option ("" when there is none).
func copyOptions(c *pg_query.CopyStmt) (f CopyFormat, encoding string) {
	f.Kind = "text"
	var delim, quote, escape string
	for _, o := range c.Options {
		d := o.GetDefElem()
		if d == nil {
			continue
		}
		switch d.Defname {
		case "format":
			f.Kind = strings.ToLower(defString(d))
		case "delimiter":
			delim = defString(d)
		case "quote":
			quote = defString(d)
		case "escape":
			escape = defString(d)
		case "encoding":
			encoding = defString(d)
		case "header":
			switch strings.ToLower(defString(d)) {
			case "match":
				f.Header = "match"
			case "", "true", "on", "1":
				f.Header = "true"
			}
		}
	}
	f.Delimiter, f.Quote = '\t', '"'
	if f.Kind == "csv" {
		f.Delimiter = ','
	}
	if delim != "" {
		f.Delimiter = delim[0]
	}
	if quote != "" {
		f.Quote = quote[0]
	}
	f.Escape = f.Quote
	if escape != "" {
		f.Escape = escape[0]
	}
	return f, encoding
}

// defString returns an option's value as written: a string, a number or a boolean
// keyword; "" for an option without a value.
func defString(d *pg_query.DefElem) string {
	switch x := unwrap(d.Arg).(type) {
	case *pg_query.String:
		return x.Sval
	case *pg_query.Integer:
		return strconv.Itoa(int(x.Ival))
	case *pg_query.Boolean:
		return strconv.FormatBool(x.Boolval)
	case *pg_query.Float:
		return x.Fval
	}
	return ""
}

// UnsafeCopyEncoding reports whether name (as PostgreSQL spells it, or an alias) is an
// encoding in which the second byte of a multibyte character may be an ASCII byte such as
// a newline, a quote or a backslash: in its text or CSV COPY data, rows cannot be found
// without decoding the characters.
func UnsafeCopyEncoding(name string) bool {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	switch b.String() {
	case "sjis", "shiftjis", "mskanji", "windows932", "win932", "shiftjis2004",
		"big5", "win950", "windows950",
		"gbk", "cp936", "win936", "windows936", "gb18030",
		"uhc", "win949", "windows949", "johab":
		return true
	}
	return false
}

// addCopyKeys appends the missing key columns to a COPY's column list and
// records them in the plan's CopyFill.
func (p *planner) addCopyKeys(c *pg_query.CopyStmt, missing []fillRule, format CopyFormat) {
	toks := p.tokens()
	c0 := toks.at(int(c.Relation.Location))
	open := -1
	for i := c0; i >= 0 && i < len(toks); i++ {
		if toks.is(i, pg_query.Token_ASCII_40) {
			open = i
			break
		}
	}
	end := -1
	if open >= 0 {
		end = toks.matchParen(open)
	}
	if end < 0 {
		p.internal(int(c.Relation.Location), "the column list of the COPY")
		return
	}
	at := int(toks[end].Start)
	fill := &CopyFill{Format: format}
	for _, rule := range missing {
		p.add(slotEdit{edit: edit{start: at, end: at, text: ", " + rule.colSQL}})
		fill.Keys = append(fill.Keys, Slot{Kind: SlotTag, Tag: rule.Tag, Max: rule.max})
		fill.Columns = append(fill.Columns, rule.Column)
	}
	p.copyFill = fill
}

// columnName reports whether a COPY column list names col.
func columnName(list []*pg_query.Node, col string) bool {
	for _, n := range list {
		if n.GetString_().GetSval() == col {
			return true
		}
	}
	return false
}

// merge refuses a MERGE whose INSERT action into a filled table would need
// the key filled: the action runs once per source row.
func (p *planner) merge(m *pg_query.MergeStmt) {
	rules := p.rules(m.Relation, nil)
	for _, w := range m.MergeWhenClauses {
		wc := w.GetMergeWhenClause()
		if wc == nil || wc.CommandType != pg_query.CmdType_CMD_INSERT {
			continue
		}
		for _, rule := range rules {
			idx := columnIndex(wc.TargetList, rule.Column)
			ok := idx >= 0 && idx < len(wc.Values)
			if ok {
				_, isDefault := isDefaultOrNull(wc.Values[idx])
				ok = !isDefault
			}
			if !ok {
				p.fail(p.errAt(sqlstate.FeatureNotSupported, int(m.Relation.Location),
					"Give "+rule.colSQL+" a value in the INSERT action; the proxy fills keys only in INSERT … VALUES.",
					"MERGE into %s without a value for %s is not supported: its INSERT action runs once per source row", m.Relation.Relname, rule.Column))
			}
		}
	}
}
