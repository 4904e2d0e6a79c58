package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pgauth"
)

// storedSecret returns the secret PostgreSQL holds for role.
func storedSecret(t *testing.T, db, role string) string {
	t.Helper()
	ctx := testContext(t)
	conn := connect(t, testenv.WithUser(db, "postgres", ""))
	var s string
	if err := conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&s); err != nil {
		t.Fatalf("secret of %s: %v", role, err)
	}
	return s
}

// writeAuthFile writes an auth file of user, secret pairs.
func writeAuthFile(t *testing.T, pairs ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("; test users\n")
	for i := 0; i+1 < len(pairs); i += 2 {
		fmt.Fprintf(&b, "%s %s\n", pgauth.QuoteAuthField(pairs[i]), pgauth.QuoteAuthField(pairs[i+1]))
	}
	path := filepath.Join(t.TempDir(), "userlist.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// loginCase is one login through a proxy that authenticates clients itself.
type loginCase struct {
	name, user, password string
	wantCode             string // "" means the login succeeds
}

func runLogins(t *testing.T, p *testProxy, db string, cases []loginCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			conn, err := pgx.Connect(ctx, p.url(testenv.WithUser(db, tt.user, tt.password)))
			if tt.wantCode != "" {
				if err == nil {
					conn.Close(ctx)
					t.Fatalf("%s logged in, want SQLSTATE %s", tt.user, tt.wantCode)
				}
				pe := wantSQLState(t, err, tt.wantCode)
				if tt.wantCode == sqlstate.InvalidPassword {
					if want := fmt.Sprintf("password authentication failed for user %q", tt.user); pe.Message != want {
						t.Fatalf("message %q, want %q", pe.Message, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var user string
			if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
				t.Fatal(err)
			}
			if user != tt.user {
				t.Fatalf("current_user = %q, want %q", user, tt.user)
			}
		})
	}
}

// TestAuthAtProxyWithAuthFile: the proxy checks passwords against an auth file holding
// the database's own secrets, then logs in with SCRAM (recovered ClientKey) or md5.
func TestAuthAtProxyWithAuthFile(t *testing.T) {
	db := testenv.NewDatabase(t)
	file := writeAuthFile(t,
		testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser),
		testenv.MD5User, storedSecret(t, db, testenv.MD5User))

	t.Run("scram-sha-256", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthSCRAM, File: file} })
		runLogins(t, p, db, []loginCase{
			{"scram user", testenv.SCRAMUser, testenv.SCRAMPassword, ""},
			{"scram user, wrong password", testenv.SCRAMUser, "wrong", "28P01"},
			{"unknown user", "leaf_nobody", "whatever", "28P01"},
			// PostgreSQL too refuses SCRAM to a user whose secret is md5.
			{"md5 user", testenv.MD5User, testenv.MD5Password, "28P01"},
		})
	})
	t.Run("md5", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthMD5, File: file} })
		runLogins(t, p, db, []loginCase{
			{"md5 user", testenv.MD5User, testenv.MD5Password, ""},
			{"md5 user, wrong password", testenv.MD5User, "wrong", "28P01"},
			// md5 means SCRAM for a user whose secret is SCRAM, as in PostgreSQL.
			{"scram user", testenv.SCRAMUser, testenv.SCRAMPassword, ""},
			{"scram user, wrong password", testenv.SCRAMUser, "wrong", "28P01"},
			{"unknown user", "leaf_nobody", "whatever", "28P01"},
		})
	})
	t.Run("plaintext secrets", func(t *testing.T) {
		plain := writeAuthFile(t, testenv.SCRAMUser, testenv.SCRAMPassword, testenv.MD5User, testenv.MD5Password)
		p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthSCRAM, File: plain} })
		runLogins(t, p, db, []loginCase{
			{"scram user", testenv.SCRAMUser, testenv.SCRAMPassword, ""},
			{"md5 user", testenv.MD5User, testenv.MD5Password, ""},
			{"md5 user, wrong password", testenv.MD5User, "wrong", "28P01"},
		})
	})
}

// createAuthQueryFunction creates, as the superuser, the SECURITY DEFINER function that
// lets an unprivileged auth user read secrets (PgBouncer's recipe), and a role that may
// call it; it returns the role's name.
func createAuthQueryFunction(t *testing.T, db string, grantTo ...string) string {
	t.Helper()
	ctx := testContext(t)
	conn := connect(t, testenv.WithUser(db, "postgres", ""))
	role := fmt.Sprintf("leaf_authq_%d", time.Now().UnixNano()%1e9)
	stmts := []string{
		"CREATE ROLE " + role + " LOGIN",
		`CREATE FUNCTION public.leaf_user_lookup(i_username text, OUT usename name, OUT passwd text)
		 RETURNS record LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS
		 $$ SELECT usename, passwd FROM pg_catalog.pg_shadow WHERE usename = i_username $$`,
		"REVOKE ALL ON FUNCTION public.leaf_user_lookup(text) FROM public",
		"GRANT EXECUTE ON FUNCTION public.leaf_user_lookup(text) TO " + role,
	}
	for _, g := range grantTo {
		stmts = append(stmts, "GRANT EXECUTE ON FUNCTION public.leaf_user_lookup(text) TO "+g)
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		ctx := testContext(t)
		c, err := pgx.Connect(ctx, testenv.WithUser(db, "postgres", ""))
		if err == nil {
			_, _ = c.Exec(ctx, "DROP FUNCTION public.leaf_user_lookup(text)")
			_, _ = c.Exec(ctx, "DROP ROLE "+role)
			c.Close(ctx)
		}
	})
	return role
}

const testAuthQuery = "SELECT usename, passwd FROM public.leaf_user_lookup($1)"

// TestAuthAtProxyWithAuthQuery looks secrets up on the upstream through a SECURITY
// DEFINER function, as an auth user without a password and as one logging in with SCRAM.
func TestAuthAtProxyWithAuthQuery(t *testing.T) {
	db := testenv.NewDatabase(t)
	role := createAuthQueryFunction(t, db, testenv.SCRAMUser)
	t.Run("auth user without password", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) {
			s.Auth = &ClientAuth{Type: AuthMD5, User: role, Query: testAuthQuery}
		})
		runLogins(t, p, db, []loginCase{
			{"scram user", testenv.SCRAMUser, testenv.SCRAMPassword, ""},
			{"scram user, wrong password", testenv.SCRAMUser, "wrong", "28P01"},
			{"md5 user", testenv.MD5User, testenv.MD5Password, ""},
			{"md5 user, wrong password", testenv.MD5User, "wrong", "28P01"},
			{"unknown user", "leaf_nobody", "whatever", "28P01"},
			// The superuser has no password at all: refused like a wrong one.
			{"user without password", "postgres", "", "28P01"},
		})
	})
	t.Run("roles the database trusts", func(t *testing.T) {
		// pg_hba.conf trusts these new roles: a wrong password fails only because the
		// proxy checks it against the secret the auth query returns.
		ctx := testContext(t)
		admin := connect(t, testenv.WithUser(db, "postgres", ""))
		suffix := fmt.Sprint(time.Now().UnixNano() % 1e9)
		md5Role, scramRole := "leaf_q_md5_"+suffix, "leaf_q_scram_"+suffix
		for _, s := range []string{
			"SET password_encryption = 'md5'",
			"CREATE ROLE " + md5Role + " LOGIN PASSWORD 'md5-pw'",
			"SET password_encryption = 'scram-sha-256'",
			"CREATE ROLE " + scramRole + " LOGIN PASSWORD 'scram-pw'",
		} {
			if _, err := admin.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		t.Cleanup(func() {
			ctx := testContext(t)
			if c, err := pgx.Connect(ctx, testenv.WithUser(db, "postgres", "")); err == nil {
				_, _ = c.Exec(ctx, "DROP ROLE "+md5Role)
				_, _ = c.Exec(ctx, "DROP ROLE "+scramRole)
				c.Close(ctx)
			}
		})
		p := startProxy(t, db, func(s *Server) {
			s.Auth = &ClientAuth{Type: AuthMD5, User: role, Query: testAuthQuery}
		})
		runLogins(t, p, db, []loginCase{
			{"md5 role", md5Role, "md5-pw", ""},
			{"md5 role, wrong password", md5Role, "wrong", "28P01"},
			{"scram role", scramRole, "scram-pw", ""},
			{"scram role, wrong password", scramRole, "wrong", "28P01"},
		})
	})
	t.Run("auth user with SCRAM password", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) {
			s.Auth = &ClientAuth{Type: AuthSCRAM, User: testenv.SCRAMUser, Password: testenv.SCRAMPassword, Query: testAuthQuery}
		})
		runLogins(t, p, db, []loginCase{
			{"scram user", testenv.SCRAMUser, testenv.SCRAMPassword, ""},
			{"scram user, wrong password", testenv.SCRAMUser, "wrong", "28P01"},
		})
	})
	t.Run("auth user with a wrong password", func(t *testing.T) {
		p := startProxy(t, db, func(s *Server) {
			s.Auth = &ClientAuth{Type: AuthSCRAM, User: testenv.SCRAMUser, Password: "wrong", Query: testAuthQuery}
		})
		runLogins(t, p, db, []loginCase{{"scram user", testenv.SCRAMUser, testenv.SCRAMPassword, "08001"}})
	})
}

// TestAuthAtProxyAuthQueryConnection: the auth query runs on one connection kept from
// login to login, not on a new connection (and backend) per login; a password changed on
// the database takes effect at the next login all the same, and a kept connection that
// the server has closed meanwhile is replaced without failing the login.
func TestAuthAtProxyAuthQueryConnection(t *testing.T) {
	db := testenv.NewDatabase(t)
	authUser := createAuthQueryFunction(t, db)
	ctx := testContext(t)
	admin := connect(t, testenv.WithUser(db, "postgres", ""))
	// pg_hba.conf trusts a new role: only the proxy's check of the secret the query
	// returns tells its passwords apart.
	role := fmt.Sprintf("leaf_q_conn_%d", time.Now().UnixNano()%1e9)
	for _, s := range []string{
		"SET password_encryption = 'md5'",
		"CREATE ROLE " + role + " LOGIN PASSWORD 'first'",
	} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		ctx := testContext(t)
		if c, err := pgx.Connect(ctx, testenv.WithUser(db, "postgres", "")); err == nil {
			_, _ = c.Exec(ctx, "DROP ROLE "+role)
			c.Close(ctx)
		}
	})
	p := startProxy(t, db, func(s *Server) {
		s.Auth = &ClientAuth{Type: AuthMD5, User: authUser, Query: testAuthQuery}
	})
	// authBackends returns the process IDs of the auth query's connections.
	authBackends := func() []int {
		t.Helper()
		rows, err := admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND datname = current_database()", authUser)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	for i := range 3 {
		runLogins(t, p, db, []loginCase{{fmt.Sprint("login ", i+1), role, "first", ""}})
	}
	pids := authBackends()
	if len(pids) != 1 {
		t.Fatalf("%d connections of the auth user after three logins one after the other, want 1 kept: %v", len(pids), pids)
	}
	if _, err := admin.Exec(ctx, "SET password_encryption = 'md5'; ALTER ROLE "+role+" PASSWORD 'second'"); err != nil {
		t.Fatal(err)
	}
	runLogins(t, p, db, []loginCase{
		{"old password", role, "first", "28P01"},
		{"new password", role, "second", ""},
	})
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pids[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the auth query's backend to end", func() error {
		if got := authBackends(); len(got) > 0 {
			return fmt.Errorf("backends %v", got)
		}
		return nil
	})
	runLogins(t, p, db, []loginCase{{"after the kept connection was closed", role, "second", ""}})
	if got := authBackends(); len(got) != 1 || got[0] == pids[0] {
		t.Fatalf("auth user connections %v after the first was terminated, want one new", got)
	}
}

// rawStartup is what a startup over the wire brought (see rawLogin).
type rawStartup struct {
	auths []uint32                // the code of every Authentication message
	types []byte                  // the type of every message
	pid   uint32                  // the process ID of the BackendKeyData
	fail  *pgproto3.ErrorResponse // the ErrorResponse that ended the startup, if any
}

// rawLogin logs in with the pgauth client over the wire and returns the type and code of
// every Authentication message and the ErrorResponse that ends the startup, if any.
func rawLogin(t *testing.T, addr, user, password, database string) (auths []uint32, fail *pgproto3.ErrorResponse) {
	t.Helper()
	st := rawStart(t, addr, password, map[string]string{"user": user, "database": database}, false)
	return st.auths, st.fail
}

// rawStart logs in to addr over the wire with a startup packet of params, answering
// the authentication with password, up to ReadyForQuery or an ErrorResponse; with
// terminate it then ends the session with Terminate.
func rawStart(t *testing.T, addr, password string, params map[string]string, terminate bool) (st rawStartup) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	start, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: params}).Encode(nil)
	if _, err := nc.Write(start); err != nil {
		t.Fatal(err)
	}
	r := msgReader{br: bufio.NewReader(nc), maxBody: 1 << 20}
	login := &pgauth.Login{User: params["user"], Secret: &pgauth.Secret{Kind: pgauth.Plain, Password: password}}
	for {
		typ, n, err := r.next()
		if err != nil {
			t.Fatalf("reading the startup: %v (messages %q)", err, st.types)
		}
		body, err := r.readBody(n)
		if err != nil {
			t.Fatal(err)
		}
		st.types = append(st.types, typ)
		switch typ {
		case serverAuthentication:
			st.auths = append(st.auths, binary.BigEndian.Uint32(body))
			resp, err := login.Respond(body)
			if err != nil {
				t.Fatal(err)
			}
			if resp != nil {
				msg := append([]byte{clientPassword, 0, 0, 0, 0}, resp...)
				binary.BigEndian.PutUint32(msg[1:], uint32(len(resp)+4))
				if _, err := nc.Write(msg); err != nil {
					t.Fatal(err)
				}
			}
		case serverBackendKeyData:
			st.pid = binary.BigEndian.Uint32(body)
		case serverErrorResponse:
			st.fail = &pgproto3.ErrorResponse{}
			if err := st.fail.Decode(body); err != nil {
				t.Fatal(err)
			}
			return st
		case serverReadyForQuery:
			if terminate {
				if _, err := nc.Write([]byte{clientTerminate, 0, 0, 0, 4}); err != nil {
					t.Fatal(err)
				}
			}
			return st
		}
	}
}

// TestAuthAtProxyUpstreamRefuses: a client the proxy accepts but the database does not
// gets a FATAL and never an AuthenticationOk.
func TestAuthAtProxyUpstreamRefuses(t *testing.T) {
	db := testenv.NewDatabase(t)
	otherSalt := pgauth.SCRAMSecret(testenv.SCRAMPassword, []byte("not the db's salt"), 4096)
	file := writeAuthFile(t,
		testenv.DeniedUser, testenv.DeniedPassword, // pg_hba.conf rejects it
		testenv.SCRAMUser, otherSalt.String(), // right password, keys the database does not hold
		testenv.MD5User, testenv.MD5Password)
	p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthSCRAM, File: file} })
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	for _, tt := range []struct {
		name, user, password, code, message string
	}{
		{"pg_hba rejects", testenv.DeniedUser, testenv.DeniedPassword, "28000", "pg_hba.conf rejects connection"},
		{"other SCRAM keys", testenv.SCRAMUser, testenv.SCRAMPassword, "28000", "the proxy could not log into the database server"},
		{"wrong password", testenv.MD5User, "wrong", "28P01", "password authentication failed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			auths, fail := rawLogin(t, p.addr, tt.user, tt.password, dbName)
			if fail == nil {
				t.Fatalf("login succeeded (authentication messages %v)", auths)
			}
			if fail.Severity != "FATAL" || fail.Code != tt.code || !strings.Contains(fail.Message, tt.message) {
				t.Fatalf("error %s %s %q, want FATAL %s %q", fail.Severity, fail.Code, fail.Message, tt.code, tt.message)
			}
			for _, code := range auths {
				if code == pgauth.AuthOK {
					t.Fatalf("the client got AuthenticationOk before the refusal (messages %v)", auths)
				}
			}
			if len(auths) < 3 && tt.code == "28000" {
				t.Fatalf("authentication messages %v: the proxy did not authenticate the client first", auths)
			}
		})
	}
}

// TestAuthAtProxyChannelBinding: over the proxy's own TLS certificate, libpq's defaults
// (sslmode=prefer, channel_binding=prefer) and channel_binding=require work, with an
// upstream on TLS too (where the proxy binds to the database's certificate).
func TestAuthAtProxyChannelBinding(t *testing.T) {
	db := testenv.NewDatabase(t)
	cfg, caFile := proxyCertificate(t)
	file := writeAuthFile(t,
		testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser),
		testenv.TLSUser, storedSecret(t, db, testenv.TLSUser))
	ca := upstreamCA(t)
	p := startProxy(t, db, func(s *Server) {
		s.TLSConfig = cfg
		s.UpstreamSSLMode = SSLVerifyFull
		s.UpstreamRootCAs = ca
		s.Auth = &ClientAuth{Type: AuthSCRAM, File: file}
	})
	ctx := testContext(t)
	for _, tt := range []struct{ name, params string }{
		{"defaults", "sslmode=prefer"},
		// pgx fails this one unless the proxy offers SCRAM-SHA-256-PLUS.
		{"channel_binding=require", "sslmode=verify-full&sslrootcert=" + caFile + "&channel_binding=require"},
		{"channel_binding=disable", "sslmode=verify-full&sslrootcert=" + caFile + "&channel_binding=disable"},
		{"plaintext", "sslmode=disable"},
	} {
		for _, user := range []string{testenv.SCRAMUser, testenv.TLSUser} {
			t.Run(tt.name+"/"+user, func(t *testing.T) {
				password := map[string]string{testenv.SCRAMUser: testenv.SCRAMPassword, testenv.TLSUser: testenv.TLSPassword}[user]
				u := strings.SplitN(p.url(testenv.WithUser(db, user, password)), "?", 2)[0] + "?" + tt.params
				conn, err := pgx.Connect(ctx, u)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				_, isTLS := conn.PgConn().Conn().(*tls.Conn)
				if isTLS != (tt.params != "sslmode=disable") {
					t.Fatalf("client connection is %T", conn.PgConn().Conn())
				}
				var got string
				if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != user {
					t.Fatalf("current_user %q", got)
				}
			})
		}
	}
	t.Run("channel_binding=require, wrong password", func(t *testing.T) {
		u := strings.SplitN(p.url(testenv.WithUser(db, testenv.SCRAMUser, "wrong")), "?", 2)[0] +
			"?sslmode=verify-full&sslrootcert=" + caFile + "&channel_binding=require"
		_, err := pgx.Connect(ctx, u)
		wantSQLState(t, err, "28P01")
	})
}

// TestAuthAtProxyCancel: the cancel key of a session the proxy logged in for still
// cancels its statement, from pgx and from psql.
func TestAuthAtProxyCancel(t *testing.T) {
	db := testenv.NewDatabase(t)
	watcher := connect(t, db)
	file := writeAuthFile(t, testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser))
	p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthSCRAM, File: file} })
	connURL := p.url(testenv.WithUser(db, testenv.SCRAMUser, testenv.SCRAMPassword))

	conn := connectCancelling(t, connURL)
	sql := "SELECT pg_sleep(60) /* pgx, auth at the proxy */"
	done, cancel := goStatement(t, func(ctx context.Context) error { _, err := conn.Exec(ctx, sql); return err })
	waitRunning(t, watcher, sql)
	cancel()
	wantSQLState(t, result(t, done, "the cancelled statement"), "57014")

	sql = "SELECT pg_sleep(60) /* psql, auth at the proxy */"
	psqlInterrupted(t, connURL, sql, func() { waitRunning(t, watcher, sql) })
}

// TestAuthAtProxyPsql logs in with psql (libpq) through a proxy that checks passwords
// from an auth query, over the proxy's own TLS with libpq's defaults and with
// channel_binding=require, and in plaintext.
func TestAuthAtProxyPsql(t *testing.T) {
	psql := needTool(t, "psql")
	db := testenv.NewDatabase(t)
	role := createAuthQueryFunction(t, db)
	cfg, caFile := proxyCertificate(t)
	p := startProxy(t, db, func(s *Server) {
		s.TLSConfig = cfg
		s.Auth = &ClientAuth{Type: AuthMD5, User: role, Query: testAuthQuery}
	})
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.addr)
	const tlsLine = "SSL connection"
	for _, tt := range []struct {
		name, user, password, params, want string
		tls                                bool
	}{
		{"scram, defaults", testenv.SCRAMUser, testenv.SCRAMPassword, "", testenv.SCRAMUser, true},
		{"scram, channel_binding=require", testenv.SCRAMUser, testenv.SCRAMPassword,
			"sslmode=verify-ca sslrootcert=" + caFile + " channel_binding=require", testenv.SCRAMUser, true},
		{"scram, wrong password", testenv.SCRAMUser, "wrong", "", `password authentication failed for user "leaf_scram"`, false},
		{"scram, plaintext", testenv.SCRAMUser, testenv.SCRAMPassword, "sslmode=disable", testenv.SCRAMUser, false},
		{"md5, defaults", testenv.MD5User, testenv.MD5Password, "", testenv.MD5User, true},
		{"md5, wrong password", testenv.MD5User, "wrong", "", `password authentication failed for user "leaf_md5"`, false},
		// libpq refuses md5 when it must bind the channel.
		{"md5, channel_binding=require", testenv.MD5User, testenv.MD5Password, "channel_binding=require", "channel binding required", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conninfo := fmt.Sprintf("host=%s port=%s dbname=%s user=%s %s", host, port, strings.TrimPrefix(u.Path, "/"), tt.user, tt.params)
			cmd := exec.Command(psql, "-X", "-At", "-w", "-d", conninfo, "-c", `\conninfo`, "-c", "SELECT 'user ' || current_user")
			// libpq's defaults, whatever the environment says.
			cmd.Env = []string{"PGPASSWORD=" + tt.password}
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "PG") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			out, err := cmd.CombinedOutput()
			got := string(out)
			if tt.want == tt.user {
				if err != nil || !strings.Contains(got, "user "+tt.user) {
					t.Fatalf("psql: %v\n%s", err, got)
				}
			} else if err == nil || !strings.Contains(got, tt.want) {
				t.Fatalf("psql: %v\n%s\nwant %q", err, got, tt.want)
			}
			if tt.tls != strings.Contains(got, tlsLine) {
				t.Fatalf("psql over TLS: %v, want %v\n%s", !tt.tls, tt.tls, got)
			}
		})
	}
}

// TestAuthAtProxyTrust: trust lets the client in without a password only when the proxy
// can log in for it: with the auth file's plaintext secret, or where the database trusts.
func TestAuthAtProxyTrust(t *testing.T) {
	db := testenv.NewDatabase(t)
	file := writeAuthFile(t,
		testenv.MD5User, testenv.MD5Password,
		testenv.SCRAMUser, storedSecret(t, db, testenv.SCRAMUser))
	p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthTrust, File: file} })
	runLogins(t, p, db, []loginCase{
		{"database trusts", "postgres", "", ""},
		{"plaintext secret", testenv.MD5User, "", ""},
		// A SCRAM secret cannot log in without the client's proof.
		{"SCRAM secret", testenv.SCRAMUser, "", "28000"},
	})
}

// TestAuthAtProxyAuthFileReread: a changed auth file applies to the next login, without
// a restart.
func TestAuthAtProxyAuthFileReread(t *testing.T) {
	db := testenv.NewDatabase(t)
	file := writeAuthFile(t, "postgres", "first password")
	p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthSCRAM, File: file} })
	runLogins(t, p, db, []loginCase{{"before", "postgres", "first password", ""}})
	if err := os.WriteFile(file, []byte(`"postgres" "the second, longer password"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runLogins(t, p, db, []loginCase{
		{"old password", "postgres", "first password", "28P01"},
		{"new password", "postgres", "the second, longer password", ""},
	})
}

// TestPlaintextSCRAMSecretKept: a user with a plaintext secret is checked with SCRAM
// against a secret the proxy derives once per password (the key derivation is 4,096
// rounds of HMAC-SHA-256), with the same salt at every login; a new password gets a new
// secret.
func TestPlaintextSCRAMSecretKept(t *testing.T) {
	a := &ClientAuth{Type: AuthSCRAM}
	first := a.scramSecret("alice", "one")
	if want := pgauth.SCRAMSecret("one", first.Salt, first.Iterations); first.String() != want.String() {
		t.Fatalf("secret %s is not the password's (%s)", first, want)
	}
	if again := a.scramSecret("alice", "one"); again.String() != first.String() {
		t.Fatalf("second login: secret %s, want the first one %s", again, first)
	}
	changed := a.scramSecret("alice", "two")
	if want := pgauth.SCRAMSecret("two", changed.Salt, changed.Iterations); changed.String() != want.String() {
		t.Fatalf("after a new password: secret %s is not the new password's", changed)
	}
	if other := a.scramSecret("bob", "one"); bytes.Equal(other.Salt, first.Salt) {
		t.Fatal("two users share a salt")
	}
}

// TestAuthAtProxySASLprep: a plaintext password with characters SCRAM's SASLprep changes
// (here a non-ASCII space) is prepared as libpq, pgx and PostgreSQL prepare it, both to
// check the client's proof and to log in to PostgreSQL, where pg_hba.conf asks the user
// for SCRAM: any spelling that prepares to the same password logs in.
func TestAuthAtProxySASLprep(t *testing.T) {
	psql := needTool(t, "psql")
	db := testenv.NewDatabase(t)
	file := writeAuthFile(t, testenv.SASLprepUser, testenv.SASLprepPassword)
	p := startProxy(t, db, func(s *Server) { s.Auth = &ClientAuth{Type: AuthSCRAM, File: file} })
	runLogins(t, p, db, []loginCase{
		{"pgx", testenv.SASLprepUser, testenv.SASLprepPassword, ""},
		{"pgx, decomposed umlauts", testenv.SASLprepUser, "pa\u0308\u00a0ss-wo\u0308rt", ""},
		{"pgx, wrong password", testenv.SASLprepUser, "p\u00e4\u00a0ss-wort", "28P01"},
	})
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.addr)
	for _, tt := range []struct{ name, password, want string }{
		{"psql", testenv.SASLprepPassword, "user " + testenv.SASLprepUser},
		{"psql, an em space", "p\u00e4\u2003ss-w\u00f6rt", "user " + testenv.SASLprepUser},
		{"psql, wrong password", "p\u00e4\u00a0ss-wort", "password authentication failed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conninfo := fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=disable", host, port, strings.TrimPrefix(u.Path, "/"), testenv.SASLprepUser)
			cmd := exec.Command(psql, "-X", "-At", "-w", "-d", conninfo, "-c", "SELECT 'user ' || current_user")
			cmd.Env = append(os.Environ(), "PGPASSWORD="+tt.password, "PGCLIENTENCODING=UTF8")
			out, err := cmd.CombinedOutput()
			if !strings.Contains(string(out), tt.want) || (err == nil) != strings.HasPrefix(tt.want, "user ") {
				t.Fatalf("psql: %v\n%s\nwant %q", err, out, tt.want)
			}
		})
	}
}
