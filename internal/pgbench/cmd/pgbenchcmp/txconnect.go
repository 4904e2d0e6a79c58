package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/leafproxy/leafproxy/internal/pgbench"
)

// txConnectOptions size the transaction-mode hops of the connect and tx-logins groups.
type txConnectOptions struct {
	poolSize int // server connections of each pool
	clients  int // clients of the tx-logins group
	// pprofDir, when set, gets a CPU profile of leafproxy over each of its runs.
	pprofDir string
}

// loginsPerClient is how many times each client of the tx-logins group logs in, for one
// transaction each (pgbench -C -t): enough logins per run that the CPU meter's 10 ms
// ticks make a fine enough figure per login.
const loginsPerClient = 5

// txConnectHops are leafproxy and PgBouncer in transaction mode, both authenticating
// clients themselves, for the cost of a login: the connect group's rows for them and the
// tx-logins group.
type txConnectHops struct {
	connect []pgbench.Endpoint // pgbench -C -S through each hop, md5 and SCRAM
	logins  pgbench.Group      // pgbench -C -c clients -t loginsPerClient -S through each hop, md5
	stop    func()
}

// startTxConnect starts leafproxy as the production example plus --pool-mode transaction,
// --pool-size and --auth-type md5 with an auth-file, and PgBouncer with pool_mode
// transaction, the same pool size, auth_type md5 and the same userlist.txt. The file holds
// two roles of the run's own, one with an md5 password and one with a SCRAM one: md5 at
// the proxy authenticates a user with a SCRAM secret with SCRAM, in both hops, as
// PostgreSQL's md5 does. Neither hop starts a backend for a client (the pools keep their
// server connections), so what a row measures is the hop's own login: the startup
// packet, the authentication exchange and the startup answered from the pool, then one
// SELECT and the client's Terminate. With SCRAM, most of the time is pgbench's own key
// derivation (4,096 rounds of HMAC-SHA-256 per login, on the client side, with either
// hop).
func startTxConnect(ctx context.Context, h hops, o txConnectOptions) (*txConnectHops, error) {
	t := &txConnectHops{}
	var stops []func()
	t.stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	fail := func(err error) (*txConnectHops, error) {
		t.stop()
		return nil, err
	}
	if err := checkMaxConnections(ctx, h.dbURL, 4*o.poolSize); err != nil {
		return fail(err)
	}
	type role struct{ name, url, secret string }
	var roles []role
	for _, encryption := range []string{"md5", "scram-sha-256"} {
		name, password, secret, drop, err := createBenchRole(ctx, h.dbURL, encryption)
		if err != nil {
			return fail(err)
		}
		stops = append(stops, drop)
		u, err := withUser(h.dbURL, name, password)
		if err != nil {
			return fail(err)
		}
		roles = append(roles, role{name, u, secret})
	}
	dir, err := os.MkdirTemp("", "leafproxy-bench-auth-")
	if err != nil {
		return fail(err)
	}
	stops = append(stops, func() { _ = os.RemoveAll(dir) })
	secrets := make(map[string]string)
	for _, r := range roles {
		secrets[r.name] = r.secret
	}
	authFile := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(authFile, []byte(pgbench.Userlist(secrets)), 0o600); err != nil {
		return fail(err)
	}

	upstream, err := hostOf(h.dbURL)
	if err != nil {
		return fail(err)
	}
	args := append(productionArgs(h.dbURL, upstream, nil), txPoolArgs(o.poolSize, authFile)...)
	if o.pprofDir != "" {
		args = append(args, "--http-pprof")
	}
	lp, err := pgbench.StartLeafproxy(ctx, h.bin, args...)
	if err != nil {
		return fail(err)
	}
	stops = append(stops, func() { _ = lp.Close() })
	leaf := func(name, roleURL string) pgbench.Endpoint { return profiled(lp, name, roleURL, o.pprofDir) }
	var b *pgbench.PgBouncer
	if h.bouncer {
		b, err = pgbench.StartPgBouncer(ctx, h.dbURL, pgbench.BouncerOptions{
			PoolMode:   "transaction",
			PoolSize:   o.poolSize,
			MaxClients: o.clients + 100,
			AuthType:   "md5",
			Secrets:    secrets,
		})
		if err != nil {
			return fail(err)
		}
		stops = append(stops, func() { _ = b.Close() })
	}
	connectArgs := []string{"-C", "-S"}
	for i, r := range roles {
		auth := []string{"md5", "SCRAM"}[i]
		e := leaf("leafproxy tx "+auth, r.url)
		e.Args = connectArgs
		t.connect = append(t.connect, e)
		if b != nil {
			t.connect = append(t.connect, pgbench.Endpoint{Name: "pgbouncer tx " + auth, URL: b.URL(r.url), CPU: b.CPU, Args: connectArgs})
		}
	}
	if err := t.startSessionHops(ctx, h, o, upstream, authFile, secrets, roles[0].url, &stops); err != nil {
		return fail(err)
	}
	t.logins = pgbench.Group{Name: "tx-logins", Clients: []int{o.clients}, Modes: []string{"simple"}, Transactions: loginsPerClient}
	e := leaf("leafproxy tx md5", roles[0].url)
	e.Args = connectArgs
	t.logins.Endpoints = append(t.logins.Endpoints, e)
	if b != nil {
		t.logins.Endpoints = append(t.logins.Endpoints, pgbench.Endpoint{Name: "pgbouncer tx md5", URL: b.URL(roles[0].url), CPU: b.CPU, Args: connectArgs})
	}
	return t, nil
}

// startSessionHops adds to the connect group leafproxy as the production example plus
// --auth-type md5 with the auth file, in session mode (which then gives a server
// connection its client left to the next session, reset with DISCARD ALL), and PgBouncer
// in session mode with auth_type md5 (which does the same with its server_reset_query,
// DISCARD ALL), both for the md5 role of roleURL.
func (t *txConnectHops) startSessionHops(ctx context.Context, h hops, o txConnectOptions, upstream, authFile string, secrets map[string]string, roleURL string, stops *[]func()) error {
	connectArgs := []string{"-C", "-S"}
	args := append(productionArgs(h.dbURL, upstream, nil), "--auth-type", "md5", "--auth-file", authFile)
	if o.pprofDir != "" {
		args = append(args, "--http-pprof")
	}
	bins := []string{h.bin}
	if h.otherBin != "" {
		bins = append(bins, h.otherBin) // beside the other binary's, with -other-bin
	}
	for i, bin := range bins {
		lp, err := pgbench.StartLeafproxy(ctx, bin, args...)
		if err != nil {
			return err
		}
		*stops = append(*stops, func() { _ = lp.Close() })
		e := profiled(lp, []string{"leafproxy session md5", "leafproxy other session md5"}[i], roleURL, o.pprofDir)
		e.Args = connectArgs
		t.connect = append(t.connect, e)
	}
	if !h.bouncer {
		return nil
	}
	b, err := pgbench.StartPgBouncer(ctx, h.dbURL, pgbench.BouncerOptions{PoolMode: "session", AuthType: "md5", Secrets: secrets})
	if err != nil {
		return err
	}
	*stops = append(*stops, func() { _ = b.Close() })
	t.connect = append(t.connect, pgbench.Endpoint{Name: "pgbouncer session md5", URL: b.URL(roleURL), CPU: b.CPU, Args: connectArgs})
	return nil
}

// profiled returns the endpoint name of leafproxy lp for the role of roleURL; with
// pprofDir set, a CPU profile of lp over each of its runs goes there, as
// leafproxy-<name>-<run>.pprof with the name's spaces as dashes.
func profiled(lp *pgbench.Leafproxy, name, roleURL, pprofDir string) pgbench.Endpoint {
	e := pgbench.Endpoint{Name: name, URL: lp.URL(roleURL), CPU: lp.CPU}
	if pprofDir != "" {
		e.During = func(ctx context.Context, run string, d time.Duration) error {
			file := strings.ReplaceAll(name, " ", "-") + "-" + run + ".pprof"
			return lp.CPUProfile(ctx, d, filepath.Join(pprofDir, file))
		}
	}
	return e
}
