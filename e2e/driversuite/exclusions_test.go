package driversuite

// exclusions are the tests of pgx's suite that pass straight at the database but cannot
// pass through a proxy by design. Keep the list small, and give each entry its reason:
// TestPgxSuite fails when an entry no longer fails through the proxy or no longer passes
// direct, so a fixed limitation or a renamed test cannot leave a stale entry behind.
var exclusions = []exclusion{}
