// Package e2e proves leafproxy end to end: its tests build the real leafproxy binary, run
// several copies of it against real PostgreSQL and ZooKeeper servers, drive them with real
// clients (pgx, database/sql + lib/pq, GORM, psql, pgbench, Node's pg) under load, and
// break things on purpose (kill -9, database restart, ZooKeeper leader loss and session
// expiry, malformed protocol input) while checking that no ID is ever handed out twice.
//
// The package holds no library code; everything lives in its _test.go files. Run it with
// `make test`, or by hand with the test environment's variables exported:
//
//	go test ./e2e -run TestThreeProxies -v
//	LEAF_E2E_SOAK=1 go test ./e2e -run TestThreeProxies -v   # 60 s of load instead of 15 s
//	LEAF_E2E_BINARY=bin/leafproxy go test ./e2e              # test a prebuilt binary
//	go test ./e2e -run TestFaultSchedule -v -fault-duration 10m -fault-seed 42   # make soak
package e2e
