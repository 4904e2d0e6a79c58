package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// fillRefresh is the rule refresh of the proxies of TestFillRulesShared while it tests
// the interval; the SIGHUP part runs them with an hour, so only the signal can act.
const fillRefresh = 3 * time.Second

// TestFillRulesShared runs two proxies on one store: a rule `leafproxy fill add` stores
// takes effect on both within the refresh interval, and at once on SIGHUP; a stored rule
// conflicting with a proxy's configuration is logged and the rules in use stay, until the
// conflict is removed.
func TestFillRulesShared(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	addTag(t, dsn, "fill_seg_a", 100)
	addTag(t, dsn, "fill_seg_b", 100)
	for _, table := range []string{"fill_a", "fill_b", "fill_c"} {
		execSQL(t, dsn, "CREATE TABLE "+table+" (id bigint, v int)")
	}
	execSQL(t, dsn, "CREATE TABLE fill_conf (id bigint, key bigint, v int)")
	proxies := make([]*Proxy, 2)
	for i := range proxies {
		proxies[i] = StartProxy(t, []string{"fill-1", "fill-2"}[i], ProxyConfig{
			WorkerSource: "static",
			WorkerID:     21 + i,
			Upstream:     hostPort(t, dsn),
			Store:        dsn,
			Fill:         []string{"fill_conf.id=fill_seg_a"},
			Extra:        []string{"--fill-refresh", fillRefresh.String()},
		})
	}
	requireRewriting(t, proxies[0], dsn, "fill_seg_a")
	conns := make([]*pgx.Conn, len(proxies))
	for i, p := range proxies {
		conns[i] = connectSimple(t, p.URL(dsn, "postgres", ""))
	}
	leaf := func(args ...string) string {
		t.Helper()
		out, err := runLeafproxy(t, append(args, "--dsn", dsn)...)
		if err != nil {
			t.Fatalf("leafproxy %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	// filled inserts a row into table through proxy i, in a session opened before any
	// rule changed, and says whether column got an ID.
	filled := func(i int, table, column string) bool {
		t.Helper()
		var id *int64
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := conns[i].QueryRow(ctx, "INSERT INTO "+table+" (v) VALUES (1) RETURNING "+column).Scan(&id); err != nil {
			t.Fatalf("proxy %s: INSERT INTO %s: %v", proxies[i].Name, table, err)
		}
		return id != nil
	}
	// waitFilled waits until an INSERT into table through every proxy fills column, and
	// returns how long the slowest took.
	waitFilled := func(table, column string, limit time.Duration) time.Duration {
		t.Helper()
		began := time.Now()
		deadline := began.Add(limit)
		var took time.Duration
		for i := range proxies {
			for !filled(i, table, column) {
				if time.Now().After(deadline) {
					t.Fatalf("proxy %s: %s.%s still not filled after %s", proxies[i].Name, table, column, limit)
				}
				time.Sleep(50 * time.Millisecond) // polling interval of a condition with a deadline
			}
			took = time.Since(began)
		}
		return took
	}

	t.Run("interval", func(t *testing.T) {
		if filled(0, "fill_a", "id") || filled(1, "fill_a", "id") {
			t.Fatal("fill_a filled before any rule names it")
		}
		if out := leaf("fill", "add", "fill_a.id=fill_seg_a"); !strings.Contains(out, "added fill rule fill_a.id=fill_seg_a") {
			t.Fatalf("fill add: %q", out)
		}
		// One interval, plus the time the refresh and a loaded machine take (a refresh's
		// read of the store may take up to 10 s before it gives up).
		took := waitFilled("fill_a", "id", fillRefresh+30*time.Second)
		t.Logf("fill add took effect on both proxies after %s (fill-refresh %s)", took.Round(time.Millisecond), fillRefresh)
		if !filled(0, "fill_conf", "id") {
			t.Fatal("the configuration's rule was lost when the store's was added")
		}
	})

	// From here on only SIGHUP refreshes: the proxies restart with an hour's interval.
	for i, p := range proxies {
		if _, err := p.Terminate(30 * time.Second); err != nil {
			t.Fatalf("stop proxy %s: %v", p.Name, err)
		}
		p.cfg.Extra = []string{"--fill-refresh", "1h"}
		p.Start()
		conns[i] = connectSimple(t, p.URL(dsn, "postgres", ""))
	}
	hangup := func() {
		t.Helper()
		for _, p := range proxies {
			p.Signal(syscall.SIGHUP)
		}
	}

	t.Run("SIGHUP", func(t *testing.T) {
		if !filled(0, "fill_a", "id") || !filled(1, "fill_a", "id") {
			t.Fatal("a restarted proxy did not load the stored rule")
		}
		leaf("fill", "add", "fill_b.id=fill_seg_b")
		if filled(0, "fill_b", "id") || filled(1, "fill_b", "id") {
			t.Fatal("fill_b filled before any refresh")
		}
		hangup()
		took := waitFilled("fill_b", "id", 30*time.Second)
		t.Logf("after SIGHUP the new rule took effect on both proxies in %s", took.Round(time.Millisecond))
		for _, p := range proxies {
			if !strings.Contains(p.Log(), "SIGHUP") {
				t.Errorf("proxy %s does not log the SIGHUP refresh", p.Name)
			}
		}
	})

	t.Run("conflict keeps the rules in use", func(t *testing.T) {
		// The store accepts both (it holds no other rule for fill_conf), but a proxy's
		// configuration fills fill_conf.id: the merged set has two key columns.
		leaf("fill", "add", "fill_conf.key=fill_seg_b")
		leaf("fill", "add", "fill_c.id=fill_seg_b")
		leaf("fill", "remove", "fill_a.id")
		hangup()
		for _, p := range proxies {
			waitLog(t, p, "table fill_conf has two key columns", 30*time.Second)
		}
		for _, line := range strings.Split(proxies[0].Log(), "\n") {
			if strings.Contains(line, "two key columns") {
				t.Logf("logged: %s", line)
			}
		}
		for i := range proxies {
			if !filled(i, "fill_conf", "id") || filled(i, "fill_conf", "key") {
				t.Errorf("proxy %s: fill_conf's rule changed despite the conflict", proxies[i].Name)
			}
			if filled(i, "fill_c", "id") || !filled(i, "fill_a", "id") {
				t.Errorf("proxy %s applied part of a conflicting rule set", proxies[i].Name)
			}
		}
		// A proxy starting while the conflict stands starts with its configuration's rules.
		late := StartProxy(t, "fill-3", ProxyConfig{
			WorkerSource: "static",
			WorkerID:     23,
			Upstream:     hostPort(t, dsn),
			Store:        dsn,
			Fill:         []string{"fill_conf.id=fill_seg_a"},
			Extra:        []string{"--fill-refresh", "1h"},
		})
		if log := late.Log(); !strings.Contains(log, "starting with the fill rules of the configuration only") ||
			!strings.Contains(log, "table fill_conf has two key columns") {
			t.Errorf("proxy %s does not log the conflict at start", late.Name)
		}
		lateConn := connectSimple(t, late.URL(dsn, "postgres", ""))
		for table, want := range map[string]bool{"fill_conf": true, "fill_c": false, "fill_b": false} {
			var id *int64
			if err := lateConn.QueryRow(context.Background(), "INSERT INTO "+table+" (v) VALUES (1) RETURNING id").Scan(&id); err != nil {
				t.Fatal(err)
			}
			if (id != nil) != want {
				t.Errorf("proxy %s started during a conflict: %s filled = %v, want %v", late.Name, table, id != nil, want)
			}
		}

		// Removing the conflicting rule lets the next refresh apply the rest.
		leaf("fill", "remove", "fill_conf.key")
		hangup()
		waitFilled("fill_c", "id", 15*time.Second)
		for i := range proxies {
			if filled(i, "fill_a", "id") || !filled(i, "fill_conf", "id") || filled(i, "fill_conf", "key") {
				t.Errorf("proxy %s: after the conflict was removed, the rules are not config + store", proxies[i].Name)
			}
		}
	})
}

// connectSimple connects with the simple protocol, which plans every statement anew: a
// statement prepared before a rule changed keeps the plan it was prepared with.
func connectSimple(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnectTimeout = 15 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// waitLog waits until the proxy's log holds s.
func waitLog(t *testing.T, p *Proxy, s string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !strings.Contains(p.Log(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("proxy %s did not log %q within %s", p.Name, s, limit)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a condition with a deadline
	}
}
