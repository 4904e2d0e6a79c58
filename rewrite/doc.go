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
//   - Behind it, a second bounded LRU caches plans by shape: the token stream
//     of PostgreSQL's scanner with constants masked. A text that differs from
//     a planned one only in inlined values (an ORM's INSERT) is scanned, not
//     parsed, and gets the plan a full parse would give, edits moved to its
//     own positions. A constant whose value the outcome depends on (a
//     leaf_next tag, an EXECUTE argument, a constant the grammar interprets)
//     is keyed by its exact text. Only texts that parse, and only plans and
//     "nothing to rewrite" are learnt; refusals are parsed every time.
//   - Text that pg_query cannot parse is left alone: Plan returns (nil, nil) and
//     PostgreSQL reports its own syntax error.
//
// Decisions worth knowing (also for the README):
//   - Only unqualified leaf_next/leaf_snowflake are the proxy's; a
//     schema-qualified call such as public.leaf_next(…) is an ordinary function
//     call and is forwarded untouched. Quoted names are case-sensitive as in
//     PostgreSQL ("LEAF_NEXT" is not leaf_next).
//   - The tag is a non-empty string literal (any quoting, optionally cast to
//     text/varchar/name) or a parameter $n; anything else is 22023.
//   - In the literal rendering an ID is written as 1234::int8 so the result
//     has the type leaf_next would have had; a call that named a result column
//     keeps that name through an added AS "leaf_next".
//   - A SELECT without FROM is refused when its target list also calls a
//     built-in set-returning function (generate_series, unnest, …); a
//     user-defined set-returning function cannot be recognised without the
//     catalog.
//   - Fill rules: a rule with a Schema matches only names qualified with that
//     schema, one without matches the table in any schema. An INSERT without a
//     column list into a filled table is planned from the Catalog's column
//     list (an unqualified name is looked up in the public schema): DEFAULT
//     or NULL at the key's position is replaced, any other value is left
//     alone, and a row too short to reach the key is refused (0A000). Without
//     the table in the Catalog such an INSERT is refused (0A000). Plans
//     depend on the Catalog: CatalogChanged drops every cached plan. A key of
//     type integer or smallint gets slots with a Max the proxy checks (22003).
//     A COPY … FROM without a column list into a filled table is refused
//     (0A000) with a hint to list the columns. A key given as a parameter or an
//     expression passes untouched even if it is NULL at run time; only DEFAULT
//     and a literal NULL are replaced.
//   - COPY … FROM STDIN (binary, text or CSV) into a filled table whose
//     column list leaves keys out gets them appended to the list, and a
//     CopyFill tells the proxy to append one field per key to every row, with
//     the options it needs to find the rows (delimiter, quote, escape, header).
//     Any other COPY FROM that leaves a key out (a file, a program) is refused
//     (0A000): its rows would take the key from the column's default. So is one
//     whose ENCODING option names an encoding whose multibyte characters may
//     hold ASCII bytes (SJIS, BIG5, GBK, GB18030, UHC, JOHAB); the proxy checks
//     the session's client_encoding itself.
//   - SELECT leaf_next('tag', n) is planned as a Batch only as a query of its
//     own; anywhere else it is refused (0A000), since it returns a set of rows.
//   - SELECT leaf_decode(id), as a query of its own, becomes SQL that splits
//     the ID by the configured snowflake layout; anywhere else it is refused.
//   - PREPARE name AS <statement with slots> declares the slots as trailing
//     int8 parameters (PREPARE p (unknown, int8) AS …; a parameter that only
//     carried a leaf_next tag is declared text), so each EXECUTE appends fresh
//     IDs as extra arguments.
//   - PREPARE with slots, EXECUTE, DEALLOCATE and DISCARD ALL carry session
//     state. Plan.Prepare, Execute and Deallocate are set only when the string
//     is that one statement. In a string of several statements a PREPARE with
//     slots is refused (0A000), and EXECUTE/DEALLOCATE/DISCARD ALL are listed
//     in Plan.SessionRefs: the proxy forwards the string when none of them
//     touches a statement with slots (Plan.SessionConflict), and refuses it
//     otherwise, because it cannot inject IDs into one EXECUTE among several.
//   - leaf_next($n) in a simple Query has no parameter to read the tag from;
//     the proxy reports that, the plan only says SlotTagParam.
//   - Texts longer than 32 KiB are planned on every use rather than cached,
//     and so are texts that are not valid UTF-8.
package rewrite
