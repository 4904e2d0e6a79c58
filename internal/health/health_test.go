package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestProbeStates(t *testing.T) {
	var fail error
	var changes []State
	p := &Probe{Name: "upstream", Target: "db:5432",
		Check:    func(context.Context) error { return fail },
		OnChange: func(s State) { changes = append(changes, s) }}
	if got := p.State().Problem(); got != "upstream db:5432 not checked yet" {
		t.Errorf("before the first check: %q", got)
	}
	ctx := context.Background()
	fail = errors.New("dial tcp db:5432: connect: connection refused\n\tsecond line")
	p.CheckNow(ctx)
	p.CheckNow(ctx)
	st := p.State()
	if st.OK || !st.Checked || st.LastError != "dial tcp db:5432: connect: connection refused second line" {
		t.Errorf("after a failure: %+v", st)
	}
	if got := st.Problem(); !strings.HasPrefix(got, "upstream db:5432 unreachable since ") || !strings.HasSuffix(got, ": "+st.LastError) {
		t.Errorf("problem %q", got)
	}
	fail = nil
	p.CheckNow(ctx)
	st = p.State()
	if !st.OK || st.Problem() != "" || st.LastError == "" {
		t.Errorf("after recovery (the last error is kept): %+v", st)
	}
	if len(changes) != 2 || changes[0].OK || !changes[1].OK {
		t.Errorf("OnChange calls %+v, want a failure then a recovery", changes)
	}
	// A check cut short by shutdown records nothing.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	fail = errors.New("canceled")
	p.CheckNow(canceled)
	if !p.State().OK {
		t.Error("a canceled check changed the state")
	}
}

// serveOnce accepts one connection, reads the SSLRequest and answers with b.
func serveOnce(t *testing.T, b byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 8)
		if _, err := c.Read(buf); err == nil {
			c.Write([]byte{b})
		}
	}()
	return ln.Addr().String()
}

func TestDialPostgres(t *testing.T) {
	ctx := context.Background()
	if err := DialPostgres(ctx, serveOnce(t, 'N')); err != nil {
		t.Errorf("a server answering N: %v", err)
	}
	if err := DialPostgres(ctx, serveOnce(t, 'H')); err == nil || !strings.Contains(err.Error(), "not a PostgreSQL server") {
		t.Errorf("a server answering H: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	if err := DialPostgres(ctx, addr); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("a closed port: %v", err)
	}
}

// TestDialPostgresLeavesNoTrace probes a real PostgreSQL (with TLS on) repeatedly and
// checks that its log has no line about the probes: a probe every 2 s must not flood it.
func TestDialPostgresLeavesNoTrace(t *testing.T) {
	pg := testenv.NewPostgres(t)
	addr := fmt.Sprintf("127.0.0.1:%d", pg.Port)
	logFile := filepath.Join(pg.Dir, "postgres.log")
	before, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 5 {
		if err := DialPostgres(ctx, addr); err != nil {
			t.Fatalf("probe: %v", err)
		}
	}
	// A session that ends after the probes: its log line (if any) proves the server has
	// written what the probes caused before we read the log.
	conn, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	after, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if added := strings.TrimSpace(string(after[len(before):])); added != "" {
		t.Errorf("the probes made the server log:\n%s", added)
	}
}
