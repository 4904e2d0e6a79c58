package proxy

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// reuseProxy starts a proxy in session mode that authenticates clients from an auth
// file and gives server connections to later sessions; configure adjusts it further.
func reuseProxy(t *testing.T, db string, configure ...func(*Server)) (*testProxy, string) {
	t.Helper()
	file := writeAuthFile(t, testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser))
	p := startProxy(t, db, append([]func(*Server){func(s *Server) {
		s.Auth = &ClientAuth{Type: AuthSCRAM, File: file}
		s.ReuseSessionServers = true
	}}, configure...)...)
	return p, p.url(testenv.WithUser(db, testenv.SCRAMUser, testenv.SCRAMPassword))
}

// session opens a client session (whose cancelled contexts send a CancelRequest), runs
// f on it and ends it with Terminate, returning its backend's process ID.
func session(t *testing.T, connURL string, f func(ctx context.Context, conn *pgx.Conn)) uint32 {
	t.Helper()
	ctx := testContext(t)
	conn := dialCancelling(t, connURL)
	defer conn.Close(ctx)
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if f != nil {
		f(ctx, conn)
	}
	return pid
}

// waitIdleServers waits until the proxy keeps n server connections for later sessions.
func waitIdleServers(t *testing.T, s *Server, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%d idle server connections", n), func() error {
		if got := s.SessionServers().Idle; got != n {
			return fmt.Errorf("%d idle", got)
		}
		return nil
	})
}

// backendGone waits until the backend pid has ended.
func backendGone(t *testing.T, watcher *pgx.Conn, pid uint32) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("backend %d to end", pid), func() error {
		var n int
		if err := watcher.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("backend %d still there", pid)
		}
		return nil
	})
}

// TestSessionReuse: in session mode a server connection its client left idle serves
// the next session of the same user, database and startup parameters, reset: nothing
// the first session set up (settings, temporary tables, prepared statements, advisory
// locks, LISTEN) is seen by the second, which gets a cancel key of its own that
// cancels its statements. Over event loops and goroutine pairs, with and without TLS to
// the database.
func TestSessionReuse(t *testing.T) {
	db := testenv.NewDatabase(t)
	watcher := connect(t, db)
	for _, tt := range []struct {
		name       string
		goroutines bool
		ssl        SSLMode
	}{
		{"event loops", false, SSLDisable},
		{"event loops, TLS upstream", false, SSLRequire},
		{"goroutine pairs", true, SSLDisable},
		{"goroutine pairs, TLS upstream", true, SSLRequire},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, connURL := reuseProxy(t, db, func(s *Server) {
				s.GoroutineRelay = tt.goroutines
				s.UpstreamSSLMode = tt.ssl
			})
			var firstKey []byte
			first := session(t, connURL, func(ctx context.Context, conn *pgx.Conn) {
				firstKey = conn.PgConn().SecretKey()
				for _, sql := range []string{
					"SET search_path = pg_catalog",
					"SET application_name = 'first session'",
					"SET statement_timeout = '7s'",
					"CREATE TEMP TABLE reuse_t (x int)",
					"PREPARE reuse_s AS SELECT 1",
					"SELECT pg_advisory_lock(4242)",
					"LISTEN reuse_channel",
				} {
					if _, err := conn.Exec(ctx, sql); err != nil {
						t.Fatalf("%s: %v", sql, err)
					}
				}
			})
			waitIdleServers(t, p.srv, 1)
			second := session(t, connURL, func(ctx context.Context, conn *pgx.Conn) {
				if bytes.Equal(conn.PgConn().SecretKey(), firstKey) {
					t.Error("the second session got the first one's cancel key")
				}
				if got := conn.PgConn().ParameterStatus("application_name"); got != "" {
					t.Errorf("application_name reported as %q, want the startup's empty one", got)
				}
				var searchPath, timeout string
				var temp, prepared, locks, listens int
				err := conn.QueryRow(ctx, `SELECT current_setting('search_path'), current_setting('statement_timeout'),
					(to_regclass('pg_temp.reuse_t') IS NOT NULL)::int,
					(SELECT count(*) FROM pg_prepared_statements WHERE name = 'reuse_s'),
					(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'),
					(SELECT count(*) FROM pg_listening_channels())`).Scan(&searchPath, &timeout, &temp, &prepared, &locks, &listens)
				if err != nil {
					t.Fatal(err)
				}
				if searchPath != `"$user", public` || timeout != "0" || temp != 0 || prepared != 0 || locks != 0 || listens != 0 {
					t.Errorf("state of the first session left: search_path %q, statement_timeout %q, %d temp tables, %d prepared, %d advisory locks, %d channels listened to",
						searchPath, timeout, temp, prepared, locks, listens)
				}

				sql := "SELECT pg_sleep(60) /* reused session */"
				done, cancel := goStatement(t, func(ctx context.Context) error { _, err := conn.Exec(ctx, sql); return err })
				waitRunning(t, watcher, sql)
				cancel()
				wantSQLState(t, result(t, done, "the cancelled statement"), "57014")
			})
			if second != first {
				t.Fatalf("second session on backend %d, want the first one's, %d", second, first)
			}
			waitIdleServers(t, p.srv, 1)
		})
	}
}

// TestSessionReuseRewriting: a session of the rewriting proxy that used the fast path
// and filled an INSERT leaves its server connection to the next session, which gets IDs
// too.
func TestSessionReuseRewriting(t *testing.T) {
	db := testenv.NewDatabase(t)
	admin := connect(t, db)
	if _, err := admin.Exec(testContext(t), "CREATE TABLE orders (id bigint PRIMARY KEY, item text); GRANT ALL ON orders TO "+testenv.SCRAMUser); err != nil {
		t.Fatal(err)
	}
	file := writeAuthFile(t, testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser))
	p, ids := rewritingProxy(t, db, func(s *Server) {
		s.Auth = &ClientAuth{Type: AuthSCRAM, File: file}
		s.ReuseSessionServers = true
	})
	connURL := p.url(testenv.WithUser(db, testenv.SCRAMUser, testenv.SCRAMPassword))
	work := func(ctx context.Context, conn *pgx.Conn) {
		var id int64
		if err := conn.QueryRow(ctx, "SELECT leaf_next('order')").Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "INSERT INTO orders (item) VALUES ($1)", "x"); err != nil {
			t.Fatal(err)
		}
	}
	first := session(t, connURL, work)
	waitIdleServers(t, p.srv, 1)
	if second := session(t, connURL, work); second != first {
		t.Fatalf("second session on backend %d, want %d", second, first)
	}
	var n int
	if err := admin.QueryRow(testContext(t), "SELECT count(DISTINCT id) FROM orders").Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d orders with distinct IDs (%v), want 2", n, err)
	}
	if got := ids.issued("order"); got != 4 {
		t.Fatalf("%d IDs issued, want 4", got)
	}
}

// TestSessionReuseRefused: a server connection is closed with its session, never given
// to another, when its client left in a transaction or with a statement running, when
// the proxy relays the login (passthrough) or does not reuse, when it is past its
// lifetime; one idle past server-idle-timeout is closed, and so is every idle one at shutdown; one whose backend
// ended while idle is passed over; and a session of other startup parameters gets a
// connection of its own.
func TestSessionReuseRefused(t *testing.T) {
	db := testenv.NewDatabase(t)
	watcher := connect(t, db)
	t.Run("left in a transaction", func(t *testing.T) {
		p, connURL := reuseProxy(t, db)
		pid := session(t, connURL, func(ctx context.Context, conn *pgx.Conn) {
			if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
		})
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("left with a statement running", func(t *testing.T) {
		p, connURL := reuseProxy(t, db)
		ctx := testContext(t)
		conn := dialCancelling(t, connURL)
		var pid uint32
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		sql := "SELECT pg_sleep(1) /* left running */"
		done := make(chan error, 1)
		go func() { _, err := conn.Exec(ctx, sql); done <- err }()
		waitRunning(t, watcher, sql)
		conn.PgConn().Conn().Close() // no Terminate: the socket just closes
		<-done
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("passthrough", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) { s.ReuseSessionServers = true })
		pid := session(t, p.url(testenv.WithUser(db, testenv.SCRAMUser, testenv.SCRAMPassword)), nil)
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("reuse off", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.ReuseSessionServers = false })
		pid := session(t, connURL, nil)
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("past its lifetime", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.ServerLifetime = time.Nanosecond })
		pid := session(t, connURL, nil)
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("server-idle-timeout", func(t *testing.T) {
		p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.ServerIdleTimeout = 50 * time.Millisecond })
		pid := session(t, connURL, nil)
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("backend ended while idle", func(t *testing.T) {
		p, connURL := reuseProxy(t, db)
		pid := session(t, connURL, nil)
		waitIdleServers(t, p.srv, 1)
		if _, err := watcher.Exec(testContext(t), "SELECT pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		backendGone(t, watcher, pid)
		if got := session(t, connURL, nil); got == pid {
			t.Fatalf("session on the ended backend %d", pid)
		}
		waitIdleServers(t, p.srv, 1)
	})
	t.Run("shutdown", func(t *testing.T) {
		p, connURL := reuseProxy(t, db)
		pid := session(t, connURL, nil)
		waitIdleServers(t, p.srv, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		backendGone(t, watcher, pid)
		waitIdleServers(t, p.srv, 0)
	})
	t.Run("other startup parameters", func(t *testing.T) {
		p, connURL := reuseProxy(t, db)
		pid := session(t, connURL, nil)
		waitIdleServers(t, p.srv, 1)
		other := session(t, connURL+"&application_name=other", func(ctx context.Context, conn *pgx.Conn) {
			var name string
			if err := conn.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil || name != "other" {
				t.Errorf("application_name %q (%v), want other", name, err)
			}
		})
		if other == pid {
			t.Fatal("a session of other startup parameters got the idle connection")
		}
		waitIdleServers(t, p.srv, 2)
	})
}

// rawSession logs in to addr with a startup packet of params (see rawStart) and ends the
// session with Terminate; it returns the process ID of the BackendKeyData and the types of
// the messages of the startup.
func rawSession(t *testing.T, addr, password string, params map[string]string) (pid uint32, types []byte) {
	t.Helper()
	st := rawStart(t, addr, password, params, true)
	if st.fail != nil {
		t.Fatalf("startup failed: %s", st.fail.Message)
	}
	return st.pid, st.types
}

// TestSessionReuseProtocolOptions: a session whose startup asks for protocol options
// (_pq_.*), which the server answers with a NegotiateProtocolVersion, leaves no server
// connection for later sessions, which would not be told.
func TestSessionReuseProtocolOptions(t *testing.T) {
	db := testenv.NewDatabase(t)
	watcher := connect(t, db)
	p, _ := reuseProxy(t, db)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"user": testenv.SCRAMUser, "database": strings.TrimPrefix(u.Path, "/")}
	pid, _ := rawSession(t, p.addr, testenv.SCRAMPassword, params)
	waitIdleServers(t, p.srv, 1)
	if again, _ := rawSession(t, p.addr, testenv.SCRAMPassword, params); again != pid {
		t.Fatalf("second raw session on backend %d, want %d", again, pid)
	}
	waitIdleServers(t, p.srv, 1)

	params["_pq_.leafproxy_test"] = "on"
	pid, types := rawSession(t, p.addr, testenv.SCRAMPassword, params)
	if !bytes.Contains(types, []byte{'v'}) {
		t.Fatalf("startup messages %q hold no NegotiateProtocolVersion", types)
	}
	backendGone(t, watcher, pid)
	waitIdleServers(t, p.srv, 1)
}

// TestSessionReusePsql: psql sessions one after another, over the proxy's TLS, get the
// backend of the one before, reset: what the first set up is gone in the second.
func TestSessionReusePsql(t *testing.T) {
	db := testenv.NewDatabase(t)
	cfg, _ := proxyCertificate(t)
	p, connURL := reuseProxy(t, db, func(s *Server) { s.TLSConfig = cfg })
	connURL = strings.Replace(connURL, "sslmode=disable", "sslmode=require", 1)
	psql := func(sql string) string {
		t.Helper()
		out, err := runTool(t, "psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", connURL, "-c", sql)
		if err != nil {
			t.Fatalf("psql -c %q: %v\n%s", sql, err, out)
		}
		waitIdleServers(t, p.srv, 1)
		return strings.TrimSpace(out)
	}
	lines := strings.Split(psql("SET search_path = pg_catalog; CREATE TEMP TABLE reuse_psql (x int); SELECT pg_backend_pid()"), "\n")
	first := lines[len(lines)-1]
	got := psql("SELECT pg_backend_pid() || ' ' || current_setting('search_path') || ' ' || (to_regclass('pg_temp.reuse_psql') IS NULL)")
	if want := first + ` "$user", public true`; got != want {
		t.Fatalf("second psql session: %q, want %q", got, want)
	}
}

// TestSessionReuseConcurrent: clients that come and go at once, some leaving in the
// middle of a transaction, never see what another session set up, and the proxy has at
// most pool-size server connections open, the clients beyond it waiting their turn.
func TestSessionReuseConcurrent(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, connURL := reuseProxy(t, db, func(s *Server) { s.Pooling.PoolSize = 4 })
	const workers, sessions = 8, 15
	errs := make(chan error, workers)
	stop, most := make(chan struct{}), make(chan SessionServerFigures, 1)
	go func() {
		var top SessionServerFigures
		for {
			f := p.srv.SessionServers()
			top.Open, top.Waiting = max(top.Open, f.Open), max(top.Waiting, f.Waiting)
			select {
			case <-stop:
				most <- top
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	for w := range workers {
		go func() {
			errs <- func() error {
				for i := range sessions {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					conn, err := pgx.Connect(ctx, connURL)
					if err != nil {
						cancel()
						return err
					}
					var path string
					var temp int
					err = conn.QueryRow(ctx, `SELECT current_setting('search_path'),
						(to_regclass('pg_temp.reuse_leak') IS NOT NULL)::int`).Scan(&path, &temp)
					if err == nil && (path != `"$user", public` || temp != 0) {
						err = fmt.Errorf("session %d/%d found search_path %q and %d temporary tables", w, i, path, temp)
					}
					for _, sql := range []string{fmt.Sprintf("SET search_path = s_%d_%d", w, i), "CREATE TEMP TABLE reuse_leak (x int)"} {
						if err == nil {
							_, err = conn.Exec(ctx, sql)
						}
					}
					if err == nil && i%3 == 0 {
						_, err = conn.Exec(ctx, "BEGIN") // left in a transaction: closed, not reused
					}
					conn.Close(ctx)
					cancel()
					if err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if top := <-most; top.Open > 4 || top.Waiting == 0 {
		t.Fatalf("at most %d server connections open (pool-size 4) and %d sessions waiting; want at most 4, and some waiting", top.Open, top.Waiting)
	}
	if f := p.srv.SessionServers(); f.Idle > 4 || f.Reused == 0 {
		t.Fatalf("%d idle server connections (pool-size 4), %d sessions on a reused one", f.Idle, f.Reused)
	}
}

// TestSessionReuseLibPQ: database/sql over lib/pq, which prepares its statements on the
// server, gets the backend of its previous session, with no statement of that session
// left there, and prepares again.
func TestSessionReuseLibPQ(t *testing.T) {
	db := testenv.NewDatabase(t)
	p, connURL := reuseProxy(t, db)
	session := func() (pid uint32, prepared int) {
		t.Helper()
		pq, err := sql.Open("postgres", connURL)
		if err != nil {
			t.Fatal(err)
		}
		defer pq.Close()
		stmt, err := pq.Prepare("SELECT pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements) WHERE $1::int = 1")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if err := stmt.QueryRow(1).Scan(&pid, &prepared); err != nil {
			t.Fatal(err)
		}
		return pid, prepared
	}
	first, n := session()
	if n != 1 {
		t.Fatalf("first session: %d prepared statements, want lib/pq's one", n)
	}
	waitIdleServers(t, p.srv, 1)
	second, n := session()
	if second != first || n != 1 {
		t.Fatalf("second session on backend %d with %d prepared statements, want %d with 1", second, n, first)
	}
}
