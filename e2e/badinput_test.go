package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// rawSession is a hand-driven protocol connection to the proxy.
type rawSession struct {
	conn net.Conn
	fe   *pgproto3.Frontend
}

// dialRaw connects without saying anything.
func dialRaw(t testing.TB, p *Proxy) *rawSession {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawSession{conn: c, fe: pgproto3.NewFrontend(c, c)}
}

// startRaw connects and completes a trust login as postgres to the database of dbURL.
func startRaw(t testing.TB, p *Proxy, dbURL string) *rawSession {
	t.Helper()
	s := dialRaw(t, p)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	s.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "postgres", "database": db}})
	if err := s.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	s.conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer s.conn.SetDeadline(time.Time{})
	for {
		msg, err := s.fe.Receive()
		if err != nil {
			t.Fatalf("login: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			t.Fatalf("login: %s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			return s
		}
	}
}

// outcome waits for the proxy's answer to bad input: the first ErrorResponse, or the
// connection closing. A session that stays silent for 10 s, or answers with success, is
// reported as such.
func (s *rawSession) outcome() (string, error) {
	s.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		msg, err := s.fe.Receive()
		var ne net.Error
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
			strings.Contains(err.Error(), "connection reset"):
			return "closed", nil
		case errors.As(err, &ne) && ne.Timeout():
			return "", errors.New("no error and no close within 10 s: the session hangs")
		default:
			return "", fmt.Errorf("undecodable answer: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Sprintf("error %s %s: %s", m.Severity, m.Code, m.Message), nil
		case *pgproto3.ReadyForQuery:
			return "", errors.New("ReadyForQuery without an error: the bad input was accepted")
		}
	}
}

func be32(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// typed builds a typed message with an honest length.
func typed(typ byte, body []byte) []byte {
	return append(append([]byte{typ}, be32(uint32(len(body)+4))...), body...)
}

// TestBadInput feeds the proxy malformed, truncated, oversized and hostile input on many
// sessions while a healthy client keeps working beside them. Every bad session must end
// in an error or a closed connection, the healthy client must see no failure, and the
// proxy's resident memory must stay bounded.
func TestBadInput(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill")
	dsn := testenv.NewDatabase(t)
	fx := newFixture(t, dsn, 1000)
	cfg := fx.proxyConfig(t)
	cfg.WorkerSource, cfg.WorkerID = "static", 7
	p := StartProxy(t, "fuzz", cfg)
	// The protocol half of this test needs no rewriting; the SQL half does.
	noRewrite := rewritingMissing(t, p, dsn, segA)
	healthySQL := []string{"SELECT leaf_next('" + segA + "')", "INSERT INTO orders (item, client) VALUES ('ok', 'healthy') RETURNING id"}
	if noRewrite != "" {
		healthySQL = []string{"SELECT 1::bigint", "INSERT INTO orders (id, item, client) VALUES ((random() * 1e15)::bigint, 'ok', 'healthy') RETURNING id"}
	}
	garbage := func(n int) []byte {
		b := make([]byte, n)
		r := rand.New(rand.NewPCG(uint64(n), 42))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		return b
	}

	// The healthy client.
	ctx, stopHealthy := context.WithCancel(context.Background())
	var healthyOK atomic.Int64
	var healthyErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := pgx.Connect(ctx, p.URL(dsn, "postgres", ""))
		if err != nil {
			healthyErr.Store(err)
			return
		}
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			var id int64
			err := conn.QueryRow(ctx, healthySQL[0]).Scan(&id)
			if err == nil {
				err = conn.QueryRow(ctx, healthySQL[1]).Scan(&id)
			}
			if err != nil {
				if ctx.Err() == nil {
					healthyErr.Store(err)
				}
				return
			}
			healthyOK.Add(1)
		}
	}()

	rssBefore, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}

	preStartup := []struct {
		name  string
		bytes []byte
		half  bool // half-close after sending: the client says it is done
	}{
		{"binary garbage instead of a startup packet", garbage(64), false},
		{"absurd startup length", append(be32(0x7fffffff), 0, 3, 0, 0), false},
		{"negative startup length", append(be32(0xfffffff0), 0, 3, 0, 0), false},
		{"startup length below the minimum", be32(3), false},
		{"unknown protocol version", append(be32(8), be32(0x04d20000)...), false},
		{"truncated startup packet", append(be32(80), be32(196608)...), true},
		{"truncated length", []byte{0, 0}, true},
		{"nothing at all", nil, true},
	}
	for _, tc := range preStartup {
		t.Run("startup/"+tc.name, func(t *testing.T) {
			s := dialRaw(t, p)
			if _, err := s.conn.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			if tc.half {
				s.conn.(*net.TCPConn).CloseWrite()
			}
			got, err := s.outcome()
			if err != nil {
				t.Fatal(err)
			}
			t.Log(got)
		})
	}

	bigQuery := "SELECT length('" + strings.Repeat("x", 10<<20) + "')"
	bigGarbage := garbage(10 << 20)
	inSession := []struct {
		name  string
		bytes []byte
		half  bool
	}{
		{"message length below 4", []byte{'Q', 0, 0, 0, 2}, false},
		{"absurd message length", append([]byte{'Q'}, be32(0x7ffffff0)...), false},
		{"unknown message type", typed('z', nil), false},
		{"binary garbage in SQL", typed('Q', append(append([]byte("SELECT "), garbage(200)...), 0)), false},
		{"invalid UTF-8 in SQL", typed('Q', []byte("SELECT '\xff\xfe\xfd'\x00")), false},
		{"Parse with a garbage body", typed('P', garbage(100)), false},
		{"Bind with absurd counts", typed('B', []byte("\x00\x00\x7f\xff")), false},
		{"10 MB of garbage as a query", typed('Q', append(bigGarbage, 0)), false},
		{"truncated message then half-close", append([]byte{'Q'}, append(be32(100), "SELECT"...)...), true},
		{"garbage after startup", garbage(300), true},
	}
	for _, tc := range inSession {
		t.Run("session/"+tc.name, func(t *testing.T) {
			s := startRaw(t, p, dsn)
			if _, err := s.conn.Write(tc.bytes); err != nil {
				t.Logf("write: %v", err)
			}
			if tc.half {
				s.conn.(*net.TCPConn).CloseWrite()
			}
			got, err := s.outcome()
			if err != nil {
				t.Fatal(err)
			}
			t.Log(got)
		})
	}

	// Hostile but well-formed statements: the session answers with an error and stays usable.
	t.Run("sql", func(t *testing.T) {
		if noRewrite != "" {
			testenv.SkipOrFail(t, "%s", noRewrite)
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, p.URL(dsn, "postgres", ""))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		hostile := []struct {
			name  string
			sql   string
			args  []any
			codes []string // acceptable SQLSTATEs
		}{
			{"injection in a tag literal", `SELECT leaf_next('x''); drop table orders; --')`, nil, []string{"42704", "22023"}},
			{"injection in a tag parameter", `SELECT leaf_next($1)`, []any{"x'); drop table orders; --"}, []string{"42704", "22023"}},
			{"injection in a simple-protocol tag", `SELECT leaf_next('x''); drop table orders; --')`, []any{pgx.QueryExecModeSimpleProtocol}, []string{"42704", "22023"}},
			{"injection in a filled INSERT", `INSERT INTO orders (item, client) VALUES ('a', leaf_next('x''); drop table orders; --')::text)`, nil, []string{"42704", "22023", "0A000"}},
			{"dollar-quoted injection", `SELECT leaf_next($q$x'); drop table orders; --$q$)`, nil, []string{"42704", "22023"}},
			{"10 kB tag", `SELECT leaf_next('` + strings.Repeat("t", 10000) + `')`, nil, []string{"42704", "22023"}},
			{"empty tag", `SELECT leaf_next('')`, nil, []string{"22023", "42704"}},
			{"NULL tag", `SELECT leaf_next(NULL)`, nil, []string{"22023", "22004", "42704"}},
			{"non-text tag", `SELECT leaf_next(42)`, nil, []string{"22023", "42704", "42883"}},
			{"no argument", `SELECT leaf_next()`, nil, []string{"22023", "42883", "42601"}},
		}
		for _, h := range hostile {
			_, err := conn.Exec(ctx, h.sql, h.args...)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Errorf("%s: got %v, want an SQL error", h.name, err)
				continue
			}
			ok := false
			for _, c := range h.codes {
				ok = ok || pgErr.Code == c
			}
			if !ok {
				t.Errorf("%s: SQLSTATE %s (%s), want one of %v", h.name, pgErr.Code, pgErr.Message, h.codes)
			}
			var one int
			if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatalf("%s: the session is unusable afterwards: %v", h.name, err)
			}
		}
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass('orders') IS NOT NULL").Scan(&exists); err != nil || !exists {
			t.Fatalf("table orders is gone after the injection attempts (%v)", err)
		}
		// A 10 MB statement is legal: it must work, with and without a leaf_next in it.
		// Two rounds, for the figures: RSS after each (garbage collection makes it noisy,
		// so the bound is checked over the whole test below).
		var rss []int64
		for round := 0; round < 2; round++ {
			for _, q := range []string{bigQuery, "SELECT leaf_next('" + segA + "'), length('" + strings.Repeat("y", 10<<20) + "')"} {
				// PgConn().Exec sends the text as is: pgx's own SQL sanitizer would scan
				// 10 MB under the race detector for seconds.
				results, err := conn.PgConn().Exec(ctx, q).ReadAll()
				if err != nil {
					t.Fatalf("10 MB query: %v", err)
				}
				if len(results) != 1 || len(results[0].Rows) != 1 {
					t.Fatalf("10 MB query returned %d results, want one row", len(results))
				}
				if v, err := strconv.ParseInt(string(results[0].Rows[0][0]), 10, 64); err != nil || v <= 0 {
					t.Errorf("10 MB query answered %q, want a positive number", results[0].Rows[0][0])
				}
			}
			r, err := p.RSS()
			if err != nil {
				t.Fatal(err)
			}
			rss = append(rss, r>>20)
		}
		t.Logf("FIGURE fuzz: VmRSS after each of two rounds of two 10 MB statements: %v MiB", rss)
	})

	rssAfter, err := p.RSS()
	if err != nil {
		t.Fatalf("the proxy is gone after the bad input: %v", err)
	}
	t.Logf("FIGURE fuzz: VmRSS %d MiB before, %d MiB after %d bad sessions and two rounds of two 10 MB statements",
		rssBefore>>20, rssAfter>>20, len(preStartup)+len(inSession))
	if rssAfter-rssBefore > 256<<20 {
		t.Errorf("VmRSS grew by %d MiB over the bad input", (rssAfter-rssBefore)>>20)
	}

	// Sessions that claim huge messages and then send little: the proxy must not set aside
	// memory for what it was promised.
	t.Run("promised huge messages", func(t *testing.T) {
		rssStart, err := p.RSS()
		if err != nil {
			t.Fatal(err)
		}
		const promised = 128 << 20
		// Three waves, so that the proxy's memory allocator has freed memory to reuse
		// (reused memory is zeroed, and zeroing makes it resident).
		var peak int64
		for wave := 0; wave < 3; wave++ {
			var held []*rawSession
			for i := 0; i < 8; i++ {
				s := startRaw(t, p, dsn)
				s.conn.Write(append(append([]byte{'Q'}, be32(promised)...), "SELECT "...))
				held = append(held, s)
			}
			if _, err := waitHealthy(&healthyOK, 20, 10*time.Second); err != nil {
				t.Errorf("with 8 sessions holding half-sent 128 MB messages: %v", err)
			}
			rss, err := p.RSS()
			if err != nil {
				t.Fatal(err)
			}
			peak = max(peak, rss)
			for _, s := range held {
				s.conn.Close()
			}
		}
		t.Logf("FIGURE fuzz: VmRSS %d MiB before, peak %d MiB over three waves of 8 sessions each promising a 128 MB message and sending 12 bytes",
			rssStart>>20, peak>>20)
		if peak-rssStart > 64<<20 {
			t.Errorf("VmRSS grew from %d MiB to %d MiB for message bodies that never came: the proxy sets memory aside for a message's declared length before its bytes arrive",
				rssStart>>20, peak>>20)
		}
	})

	if _, err := waitHealthy(&healthyOK, 20, 10*time.Second); err != nil {
		t.Errorf("after the bad input: %v", err)
	}
	stopHealthy()
	wg.Wait()
	if err, _ := healthyErr.Load().(error); err != nil {
		t.Errorf("the healthy client failed while the bad sessions ran: %v", err)
	}
	if _, err := p.RSS(); err != nil {
		t.Fatalf("the proxy is gone after the bad input: %v", err)
	}
	t.Logf("healthy client completed %d round trips beside the bad sessions", healthyOK.Load())
}

// waitHealthy waits for the healthy client to complete n more round trips.
func waitHealthy(ok *atomic.Int64, n int64, timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	start := ok.Load()
	for time.Since(began) < timeout {
		if ok.Load()-start >= n {
			return time.Since(began), nil
		}
		<-time.After(10 * time.Millisecond)
	}
	return time.Since(began), fmt.Errorf("the healthy client completed %d round trips in %v, want %d", ok.Load()-start, timeout, n)
}
