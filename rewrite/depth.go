package rewrite

import "github.com/leafproxy/leafproxy/internal/sqlstate"

import pg_query "github.com/pganalyze/pg_query_go/v6"

// maxChainDepth bounds how deeply a statement may nest operators before the
// rewriter parses it. libpg_query renders a parse tree recursively in C, on
// the calling thread's stack: a chain of some 20,000 operators overflows an
// 8 MB stack and a quarter of that a 2 MB one (the default thread stack where
// the stack limit is unlimited), and the process dies. PostgreSQL itself
// refuses such statements at its default max_stack_depth (2 MB) from a few
// thousand levels, so the bound turns away nothing the server would run.
const maxChainDepth = 4000

// errTooDeep refuses a statement nested too deeply to parse safely. A statement
// that may need a rewrite cannot be forwarded unread: an INSERT into a filled
// table would reach the database without its key.
var errTooDeep = &Error{
	Code:    sqlstate.StatementTooComplex,
	Message: "statement is nested too deeply for leafproxy to parse",
	Hint:    "Split the expression, or pass the values as parameters.",
}

// chainDepth estimates from the scanner's tokens how deeply the parse tree of
// a statement nests. A tree nests deeply only along chains of left-associative
// operators (a + b + c …, x::t::t …, a JOIN b JOIN c …, set operations); the
// grammar's own stack limit bounds everything right-recursive, such as nested
// parentheses or subqueries. The estimate counts such operators, restarting at
// each item of a list (a comma) but carrying the deepest item of a
// parenthesized group into what follows it, so it never underestimates a
// chain, and long VALUES lists or argument lists do not add up.
func chainDepth(toks tokens) int {
	type group struct{ base, deepest int }
	var open []group
	cur, deepest := 0, 0
	for _, t := range toks {
		switch t.Token {
		case pg_query.Token_ASCII_40, pg_query.Token_ASCII_91: // ( [
			open = append(open, group{cur, cur})
		case pg_query.Token_ASCII_41, pg_query.Token_ASCII_93: // ) ]
			if n := len(open); n > 0 {
				cur = max(cur, open[n-1].deepest)
				open = open[:n-1]
			}
		case pg_query.Token_ASCII_44: // ,
			if n := len(open); n > 0 {
				open[n-1].deepest = max(open[n-1].deepest, cur)
				cur = open[n-1].base
			} else {
				cur = 0
			}
		case pg_query.Token_ASCII_59: // ;
			open, cur = open[:0], 0
		case pg_query.Token_ASCII_37, pg_query.Token_ASCII_42, pg_query.Token_ASCII_43, // % * +
			pg_query.Token_ASCII_45, pg_query.Token_ASCII_47, pg_query.Token_ASCII_94, // - / ^
			pg_query.Token_Op, pg_query.Token_TYPECAST, pg_query.Token_OPERATOR,
			pg_query.Token_COLLATE, pg_query.Token_AT,
			pg_query.Token_UNION, pg_query.Token_INTERSECT, pg_query.Token_EXCEPT, pg_query.Token_JOIN:
			cur++
			deepest = max(deepest, cur)
		}
	}
	return deepest
}
