package rewrite

import (
	"sort"
	"strings"
	"unicode/utf8"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// The parse tree gives start locations only; the end of a function call, a
// VALUES row or a column list comes from PostgreSQL's own scanner (see
// scan), never from pattern matching on the text.

// tokens is the scanned text with comments dropped.
type tokens []scanToken

// at returns the index of the first token starting at or after pos.
func (t tokens) at(pos int) int {
	return sort.Search(len(t), func(i int) bool { return int(t[i].Start) >= pos })
}

func (t tokens) is(i int, tok pg_query.Token) bool {
	return i >= 0 && i < len(t) && t[i].Token == tok
}

// matchParen returns the index of the ")" closing the "(" at i, or -1.
func (t tokens) matchParen(i int) int {
	if !t.is(i, pg_query.Token_ASCII_40) {
		return -1
	}
	depth := 0
	for j := i; j < len(t); j++ {
		switch t[j].Token {
		case pg_query.Token_ASCII_40:
			depth++
		case pg_query.Token_ASCII_41:
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// closeAtDepth0 returns the index of the first ")" after i that is not
// matched by a "(" after i, or -1: the end of the list i is inside.
func (t tokens) closeAtDepth0(i int) int {
	depth := 0
	for j := i; j < len(t); j++ {
		switch t[j].Token {
		case pg_query.Token_ASCII_40:
			depth++
		case pg_query.Token_ASCII_41:
			if depth == 0 {
				return j
			}
			depth--
		}
	}
	return -1
}

// findAtDepth0 returns the index of the first token of kind tok at
// parenthesis depth 0 in [from, to), or -1.
func (t tokens) findAtDepth0(from, to int, tok pg_query.Token) int {
	depth := 0
	for j := from; j < len(t) && int(t[j].Start) < to; j++ {
		switch t[j].Token {
		case pg_query.Token_ASCII_40:
			depth++
		case pg_query.Token_ASCII_41:
			depth--
		case tok:
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// clauseEnd are the keywords that end a target-list entry at depth 0.
var clauseEnd = map[pg_query.Token]bool{
	pg_query.Token_FROM: true, pg_query.Token_INTO: true, pg_query.Token_WHERE: true,
	pg_query.Token_GROUP_P: true, pg_query.Token_HAVING: true, pg_query.Token_WINDOW: true,
	pg_query.Token_ORDER: true, pg_query.Token_LIMIT: true, pg_query.Token_OFFSET: true,
	pg_query.Token_FETCH: true, pg_query.Token_FOR: true, pg_query.Token_UNION: true,
	pg_query.Token_INTERSECT: true, pg_query.Token_EXCEPT: true,
	pg_query.Token_ASCII_44: true, pg_query.Token_ASCII_59: true,
}

// exprEnd returns the byte offset just after the target-list expression
// starting at pos.
func (t tokens) exprEnd(pos int) int {
	i := t.at(pos)
	end := pos
	depth := 0
	for j := i; j < len(t); j++ {
		tok := t[j].Token
		if depth == 0 && (clauseEnd[tok] || tok == pg_query.Token_ASCII_41) {
			break
		}
		switch tok {
		case pg_query.Token_ASCII_40, pg_query.Token_ASCII_91:
			depth++
		case pg_query.Token_ASCII_41, pg_query.Token_ASCII_93:
			depth--
		}
		end = int(t[j].End)
	}
	return end
}

// identAt returns the name token i spells, as PostgreSQL resolves it:
// quoted identifiers verbatim, others folded to lower case.
func (t tokens) identAt(sql string, i int) string {
	if i < 0 || i >= len(t) {
		return ""
	}
	s := sql[t[i].Start:t[i].End]
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return truncateIdent(strings.ReplaceAll(s[1:len(s)-1], `""`, `"`))
	}
	return truncateIdent(strings.ToLower(s))
}

// maxIdentLen is NAMEDATALEN-1: PostgreSQL truncates longer identifiers.
const maxIdentLen = 63

// truncateIdent cuts name as PostgreSQL does, at a character boundary.
func truncateIdent(name string) string {
	if len(name) <= maxIdentLen {
		return name
	}
	n := maxIdentLen
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}
