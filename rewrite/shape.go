package rewrite

import (
	"encoding/binary"
	"slices"
	"sort"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// The shape cache is the second cache level, behind the exact-text LRU.
// Clients of the simple query protocol inline their values, so the same
// INSERT arrives with different literals every time and the text cache
// misses. Such texts have the same shape: the text with every constant token
// (string, number, bit string) masked by its kind. PostgreSQL's scanner
// decides what is a constant, so two texts of one shape give the grammar the
// same token kinds in the same order, and parse to the same tree up to the
// constants' values. A plan learnt from one text is stored with its edit
// positions relative to the constants before them, and re-anchored onto the
// next text of the shape without parsing it.
//
// Some outcomes depend on a constant's value, not only its kind; those
// constants' exact text becomes part of the key (see shape.deps). Only
// texts that parse are learnt, and only successful plans or "nothing to
// rewrite": a refusal carries a position that moves with the constants, and
// is rare enough to parse again.

// constKind returns the letter the shape key gives a constant token, or 0
// for any other token.
func constKind(t pg_query.Token) byte {
	switch t {
	case pg_query.Token_ICONST:
		return 'i'
	case pg_query.Token_FCONST:
		return 'f'
	case pg_query.Token_SCONST:
		return 's'
	case pg_query.Token_USCONST:
		return 'u'
	case pg_query.Token_BCONST:
		return 'b'
	case pg_query.Token_XCONST:
		return 'x'
	}
	return 0
}

// shape is a scanned text and the key of its shape.
type shape struct {
	sql    string
	toks   tokens
	consts []int // indexes into toks of the constant tokens, in textual order
	// key is the text with each constant replaced by NUL, its kind letter
	// and whether its first and last bytes are identifier bytes (rendering
	// puts a space between an ID and an adjacent identifier byte). The text
	// holds no NUL, so the key reads back unambiguously. A leading byte says
	// whether the text mentions leaf_ at all, which the planner checks on
	// the whole text, constants included.
	key string
}

// shapeOf computes the shape of sql, whose tokens without comments are
// toks; comments stay in the key like the rest of the text between
// constants.
func shapeOf(sql string, toks tokens) *shape {
	n := 0
	for _, t := range toks {
		if constKind(t.Token) != 0 {
			n++
		}
	}
	sh := &shape{sql: sql, toks: toks, consts: make([]int, 0, n)}
	var b strings.Builder
	b.Grow(len(sql) + 1 + 4*n)
	if containsFold(sql, "leaf_") {
		b.WriteByte('L')
	} else {
		b.WriteByte('l')
	}
	pos := 0
	for i, t := range toks {
		k := constKind(t.Token)
		if k == 0 {
			continue
		}
		start, end := int(t.Start), int(t.End)
		if start < pos || end <= start {
			return nil
		}
		b.WriteString(sql[pos:start])
		b.Write([]byte{0, k, identClass(sql[start]), identClass(sql[end-1])})
		pos = end
		sh.consts = append(sh.consts, i)
	}
	b.WriteString(sql[pos:])
	sh.key = b.String()
	return sh
}

func identClass(c byte) byte {
	if isIdentByte(c) {
		return '1'
	}
	return '0'
}

// constText returns the text of constant c.
func (sh *shape) constText(c int) string {
	t := sh.toks[sh.consts[c]]
	return sh.sql[t.Start:t.End]
}

// depKey is the key of the plans of this shape whose outcome depends on
// the constants deps: the shape key followed by each constant's index and
// exact text. The separator NUL 0x01 never occurs in a shape key.
func (sh *shape) depKey(deps []int) (string, bool) {
	n := len(sh.key) + 2
	for _, c := range deps {
		if c < 0 || c >= len(sh.consts) {
			return "", false
		}
		n += len(sh.constText(c)) + 2*binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	b = append(b, sh.key...)
	b = append(b, 0, 1)
	for _, c := range deps {
		text := sh.constText(c)
		b = binary.AppendUvarint(b, uint64(c))
		b = binary.AppendUvarint(b, uint64(len(text)))
		b = append(b, text...)
	}
	return string(b), true
}

// anchor is a byte offset relative to the constants before it: rel bytes
// after the end of constant c-1, or after the start of the text when c is 0.
// The bytes between two constants are the same in every text of a shape.
type anchor struct{ c, rel int }

// anchor expresses offset x of the text as an anchor; it fails when x lies
// inside a constant.
func (sh *shape) anchor(x int) (anchor, bool) {
	c := sort.Search(len(sh.consts), func(i int) bool { return int(sh.toks[sh.consts[i]].End) > x })
	if c < len(sh.consts) && int(sh.toks[sh.consts[c]].Start) < x {
		return anchor{}, false
	}
	return anchor{c: c, rel: x - sh.base(c)}, true
}

// offset is the byte offset an anchor stands for in this text.
func (sh *shape) offset(a anchor) int { return sh.base(a.c) + a.rel }

func (sh *shape) base(c int) int {
	if c == 0 {
		return 0
	}
	return int(sh.toks[sh.consts[c-1]].End)
}

// deps returns the constants whose exact text the outcome of planning may
// depend on, or false when the outcome cannot be reused by shape:
//   - the constants the planner read (a leaf_next tag, EXECUTE arguments);
//   - U&'…' strings, whose escapes the parser checks, not the scanner;
//   - constants that did not become an A_Const expression node (directly,
//     or negated by a "-" right before them). Where the grammar makes an
//     A_Const it copies the constant without looking at its value;
//     elsewhere it may check or interpret the value: float(p) becomes
//     float4 or float8, SET STATISTICS checks its range, a UESCAPE
//     character is validated, option values become names in the tree.
//
// Everything else the planner looks at is the same in every text of the
// shape: node types and names come from the tokens between constants,
// and locations are mapped through the token stream.
func (sh *shape) deps(res planned) ([]int, bool) {
	exprs := make(map[int32]bool, len(res.consts))
	for _, loc := range res.consts {
		exprs[loc] = true
	}
	reads := make(map[int32]bool, len(res.reads))
	for _, loc := range res.reads {
		reads[int32(loc)] = true
	}
	var deps []int
	matched := 0
	for c, i := range sh.consts {
		t := sh.toks[i]
		expr := exprs[t.Start] || (i > 0 && sh.toks[i-1].Token == pg_query.Token_ASCII_45 && exprs[sh.toks[i-1].Start])
		if reads[t.Start] {
			matched++
		}
		if reads[t.Start] || !expr || t.Token == pg_query.Token_USCONST {
			deps = append(deps, c)
		}
	}
	// A value read from anything but a constant token's start cannot be
	// keyed; it would be a planner change this code does not know about.
	return deps, matched == len(reads)
}

// template is a planning outcome learnt from one text, to be applied to
// any text of the same shape and the same dependency texts.
type template struct {
	deps  []int
	plan  *Plan // without text, edits and EXECUTE position; nil: nothing to rewrite
	edits []templateEdit
	exec  anchor // where an EXECUTE receives IDs, when plan.Execute is set
}

type templateEdit struct {
	start, end anchor
	text       string
	slot       int
}

// newTemplate learns the outcome res of planning sh's text, or returns nil
// when it must not be reused.
func newTemplate(sh *shape, res planned) *template {
	if res.tree == nil || res.err != nil {
		return nil
	}
	deps, ok := sh.deps(res)
	if !ok {
		return nil
	}
	t := &template{deps: deps}
	if res.plan == nil {
		return t
	}
	p := *res.plan
	p.sql, p.edits = "", nil
	t.plan = &p
	if res.plan.edits != nil {
		t.edits = make([]templateEdit, len(res.plan.edits))
	}
	for i, e := range res.plan.edits {
		start, ok1 := sh.anchor(e.start)
		end, ok2 := sh.anchor(e.end)
		if !ok1 || !ok2 {
			return nil
		}
		t.edits[i] = templateEdit{start: start, end: end, text: e.text, slot: e.slot}
	}
	if x := res.plan.exec; x != nil {
		if t.exec, ok = sh.anchor(x.pos); !ok {
			return nil
		}
	}
	return t
}

// instantiate returns the template's plan for sh's text.
func (t *template) instantiate(sh *shape) *Plan {
	if t.plan == nil {
		return nil
	}
	p := *t.plan
	p.sql = sh.sql
	if t.edits != nil {
		p.edits = make([]edit, len(t.edits))
	}
	for i, e := range t.edits {
		p.edits[i] = edit{start: sh.offset(e.start), end: sh.offset(e.end), text: e.text, slot: e.slot}
	}
	if x := t.plan.exec; x != nil {
		p.exec = &execEdit{pos: sh.offset(t.exec), hasArgs: x.hasArgs}
	}
	return &p
}

// shapeCache maps shapes to templates. A shape whose outcome depends on no
// constant's text has its template under the shape key. Otherwise the shape
// key holds the list of those constants, and the templates are under
// depKey: one per combination of their texts (a leaf_next tag, say).
type shapeCache struct {
	lru *lru[*shapeEntry]
}

type shapeEntry struct {
	deps []int
	tmpl *template // nil on a shape key whose templates are under depKey
}

func newShapeCache(max int) *shapeCache {
	return &shapeCache{lru: newLRU[*shapeEntry](max)}
}

// lookup returns the template for sh, or nil.
func (c *shapeCache) lookup(sh *shape) *template {
	e, ok := c.lru.get(sh.key)
	if !ok {
		return nil
	}
	if len(e.deps) == 0 {
		return e.tmpl
	}
	key, ok := sh.depKey(e.deps)
	if !ok {
		return nil
	}
	if e, ok = c.lru.get(key); !ok {
		return nil
	}
	return e.tmpl
}

// learn stores the outcome res of planning sh's text, when it may be reused.
func (c *shapeCache) learn(sh *shape, res planned) {
	t := newTemplate(sh, res)
	if t == nil {
		return
	}
	if len(t.deps) == 0 {
		c.lru.put(sh.key, &shapeEntry{tmpl: t})
		return
	}
	key, ok := sh.depKey(t.deps)
	if !ok {
		return
	}
	if e, ok := c.lru.get(sh.key); !ok {
		c.lru.put(sh.key, &shapeEntry{deps: t.deps})
	} else if !slices.Equal(e.deps, t.deps) {
		// Texts of one shape depend on the same constants; keep the first
		// list rather than flip between two.
		return
	}
	c.lru.put(key, &shapeEntry{deps: t.deps, tmpl: t})
}
