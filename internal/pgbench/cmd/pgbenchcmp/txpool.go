package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/pgbench"
)

// bouncerNoPrepared is the prepared row's PgBouncer cell in the tx-pool group: PgBouncer
// 1.18 (Debian's) keeps no track of protocol-level prepared statements, so pgbench -M
// prepared fails through it in transaction mode once a client's statement meets another
// server connection.
const bouncerNoPrepared = "cannot (PgBouncer 1.18: no prepared statements in transaction mode)"

// txPoolOptions size the tx-pool group.
type txPoolOptions struct {
	clients  int // pgbench clients
	poolSize int // server connections of each pool
	// pprofDir, when set, gets a CPU profile of leafproxy over each of its runs.
	pprofDir string
	// duration of each run: pgbench opens its connections within it, and 200 new
	// backends (the direct endpoint) can take seconds on a loaded machine.
	duration time.Duration
}

// txPoolGroup is pgbench -S with many clients over a transaction pool: the server with a
// connection per client, leafproxy in transaction mode (the production example's
// arguments plus --pool-mode transaction, --pool-size and SCRAM authentication at the
// proxy from an auth-file, as the README's authentication section shows, with md5) and
// PgBouncer in transaction mode with the same pool size and the same authentication.
// Every endpoint logs in as a role of the group's own with an md5 password; the returned
// function stops the hops and drops the role.
//
// md5 rather than SCRAM: pgbench opens its 200 connections within each timed run, and
// SCRAM's deliberately slow key derivation on the client side (4,096 rounds of
// HMAC-SHA-256 per login) takes seconds of a 5-second run on a 2-core machine, whereas an
// md5 login takes microseconds; what is measured is the transactions, not the logins.
func txPoolGroup(ctx context.Context, h hops, o txPoolOptions) (pgbench.Group, func(), error) {
	g := pgbench.Group{Name: "tx-pool", Clients: []int{o.clients}, Duration: o.duration}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	pools := 2 // leafproxy's and PgBouncer's, each poolSize connections
	if h.otherBin != "" {
		pools++
	}
	if err := checkMaxConnections(ctx, h.dbURL, o.clients+pools*o.poolSize); err != nil {
		return g, stop, err
	}
	role, password, secret, dropRole, err := createBenchRole(ctx, h.dbURL, "md5")
	if err != nil {
		return g, stop, err
	}
	stops = append(stops, dropRole)
	roleURL, err := withUser(h.dbURL, role, password)
	if err != nil {
		return g, stop, err
	}
	dir, err := os.MkdirTemp("", "leafproxy-bench-auth-")
	if err != nil {
		return g, stop, err
	}
	stops = append(stops, func() { _ = os.RemoveAll(dir) })
	authFile := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(authFile, []byte(fmt.Sprintf("%q %q\n", role, secret)), 0o600); err != nil {
		return g, stop, err
	}
	add := func(e pgbench.Endpoint) {
		e.Args = []string{"-S"}
		g.Endpoints = append(g.Endpoints, e)
	}
	add(pgbench.Endpoint{Name: fmt.Sprintf("direct (%d connections)", o.clients), URL: roleURL})

	upstream, err := hostOf(h.dbURL)
	if err != nil {
		return g, stop, err
	}
	args := append(productionArgs(h.dbURL, upstream, nil), txPoolArgs(o.poolSize, authFile)...)
	if o.pprofDir != "" {
		args = append(args, "--http-pprof")
	}
	// startLeaf starts bin as the endpoint name (see profiled).
	startLeaf := func(bin, name string) error {
		lp, err := pgbench.StartLeafproxy(ctx, bin, args...)
		if err != nil {
			return err
		}
		stops = append(stops, func() { _ = lp.Close() })
		e := profiled(lp, name, roleURL, o.pprofDir)
		e.CPU = h.meter(lp)
		if h.bouncer && bin == h.bin {
			e.Rival = "pgbouncer tx"
		}
		add(e)
		return nil
	}
	if err := startLeaf(h.bin, "leafproxy tx"); err != nil {
		return g, stop, err
	}
	if h.otherBin != "" {
		if err := startLeaf(h.otherBin, "leafproxy other tx"); err != nil {
			return g, stop, err
		}
	}
	if h.bouncer {
		b, err := pgbench.StartPgBouncer(ctx, h.dbURL, pgbench.BouncerOptions{
			PoolMode:   "transaction",
			PoolSize:   o.poolSize,
			MaxClients: o.clients + 100,
			AuthType:   "md5",
			Secrets:    map[string]string{role: secret},
		})
		if err != nil {
			return g, stop, err
		}
		stops = append(stops, func() { _ = b.Close() })
		add(pgbench.Endpoint{Name: "pgbouncer tx", URL: b.URL(roleURL), CPU: h.meter(b),
			Unsupported: map[string]string{"prepared": bouncerNoPrepared}})
	}
	return g, stop, nil
}

// txPoolArgs are the serve arguments that make leafproxy a transaction pool of poolSize
// server connections per (database, user), authenticating clients itself with md5
// against authFile.
func txPoolArgs(poolSize int, authFile string) []string {
	return []string{"--pool-mode", "transaction", "--pool-size", strconv.Itoa(poolSize),
		"--auth-type", "md5", "--auth-file", authFile}
}

// createBenchRole creates a login role with a random password stored as encryption
// says ("md5" or "scram-sha-256", PostgreSQL's password_encryption), allowed to read the
// tables of dbURL's database, and returns its name, password and secret as the server
// stores it (what an auth-file holds), with a function dropping it.
func createBenchRole(ctx context.Context, dbURL, encryption string) (role, password, secret string, drop func(), err error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", "", "", nil, err
	}
	defer conn.Close(ctx)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	role = "leafbench_" + hex.EncodeToString(b[:4])
	password = hex.EncodeToString(b[4:])
	for _, stmt := range []string{
		"SET password_encryption = '" + encryption + "'",
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password),
		"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return "", "", "", nil, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "drop role:", err)
			return
		}
		defer conn.Close(ctx)
		for _, stmt := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", stmt, err)
			}
		}
	}
	if err := conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&secret); err != nil {
		drop()
		return "", "", "", nil, err
	}
	return role, password, secret, drop, nil
}

// withUser returns rawURL logging in as user with password.
func withUser(rawURL, user, password string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}

// checkMaxConnections fails unless the server accepts need more connections than the
// superuser reserve, with a message saying what to raise: the direct endpoint alone opens
// a backend per client.
func checkMaxConnections(ctx context.Context, dbURL string, need int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var max, reserved, used int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int,
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&max, &reserved, &used)
	if err != nil {
		return err
	}
	if free := max - reserved - used; free < need {
		return fmt.Errorf("tx-pool needs %d connections to the server and it has %d free (max_connections %d): raise max_connections, or lower -tx-clients", need, free, max)
	}
	return nil
}
