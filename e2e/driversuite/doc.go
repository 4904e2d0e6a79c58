// Package driversuite runs a PostgreSQL driver's own test suite through leafproxy and
// checks that the proxy is invisible to it.
//
// TestPgxSuite runs the tests of github.com/jackc/pgx/v5 (the root package, pgconn,
// pgtype, pgxpool and stdlib, at the version in go.mod) as a `go test -json` subprocess
// three times against the shared test server: straight at a fresh database, through a
// proxy.Server relaying SQL unchanged, and through a proxy.Server with a Rewriter and a
// fill rule. Every test that passes straight at the database must pass through both
// proxies; the few that cannot by design are listed, each with its reason, in
// exclusions_test.go, and the list itself is checked (an entry that no longer fails, or
// does not pass directly, fails the test so that the list cannot rot).
//
// The package holds no library code. Run it with `make test`, or by hand with the test
// environment's variables exported:
//
//	go test ./e2e/driversuite -v
//	go test ./e2e/driversuite -v -pgx.run 'TestConnect|TestExec'   # a subset of pgx's tests
package driversuite
