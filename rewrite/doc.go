// Package rewrite plans the rewrite of SQL text for leafproxy: it finds the
// leaf_next and leaf_snowflake calls and the INSERTs into tables with a fill
// rule, and turns each statement into a Plan that says where one fresh ID per
// execution goes.
//
// Guarantees:
//   - Analysis uses the real PostgreSQL grammar (pg_query); the rewritten SQL is
//     the original text with only the call sites, VALUES rows and column lists
//     edited at the parse tree's locations, so comments, formatting and dollar
//     quoting survive. Nothing is ever deparsed.
//   - An ID is substituted only where PostgreSQL evaluates the expression once
//     per execution (the target list of a SELECT without FROM, INSERT … VALUES
//     rows, CALL and EXECUTE arguments). Every other use is refused with
//     SQLSTATE 0A000 before anything reaches the database, so a substituted ID
//     can never be repeated across rows.
//   - Text that cannot need a rewrite is never parsed (a case-insensitive
//     substring prefilter), and plans are cached by SQL text in a bounded LRU.
//   - Text that pg_query cannot parse is left alone: Plan returns (nil, nil) and
//     PostgreSQL reports its own syntax error.
//
// Decisions worth knowing (also in the README):
//   - Only unqualified leaf_next/leaf_snowflake are the proxy's; a
//     schema-qualified call such as public.leaf_next(…) is an ordinary function
//     call and is forwarded untouched. Quoted names are case-sensitive as in
//     PostgreSQL ("LEAF_NEXT" is not leaf_next).
//   - In the literal rendering an ID is written as 1234::int8 so the result
//     has the type leaf_next would have had; a bare call in a target list
//     keeps its column name through an added AS "leaf_next".
//   - An INSERT without a column list into a filled table is refused (0A000):
//     without the catalog the proxy cannot know the column order.
//   - PREPARE with slots, EXECUTE, DEALLOCATE and DISCARD ALL carry session
//     state; in a string of several statements the proxy cannot inject the
//     IDs of an EXECUTE, so a PREPARE with slots there is refused and the
//     names are reported in Plan.SessionRefs for the proxy to check.
package rewrite
