package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// maxIdleTxSessionMemory bounds the proxy memory of an idle session in transaction mode:
// the target is 8 KiB; a session that kept its goroutines and buffers would cost some
// 40 KiB.
const maxIdleTxSessionMemory = 12 << 10

// idleTxSessions is how many idle sessions TestIdleTxSessionMemory opens, in batches of
// idleTxBatch (fewer goroutines at once than the race detector allows).
const (
	idleTxSessions = 10000
	idleTxBatch    = 1000
)

// TestIdleTxSessionMemory opens 10,000 idle sessions in transaction mode and measures what
// they cost the proxy: the growth of live heap plus goroutine stacks after a forced GC,
// per session, once every session has parked. The clients are bare sockets in a child
// process (this test binary running TestIdleTxClients), so that neither their memory nor
// their descriptors count against this process. Then the sessions are shown to work:
// every one runs a query after having been parked.
func TestIdleTxSessionMemory(t *testing.T) {
	raiseFileLimit(t, idleTxSessions+2000)
	db := testenv.NewDatabase(t)
	p := startProxy(t, db, inTransactionMode)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	child := startIdleTxClients(t, p.addr, u.User.Username(), u.Path[1:])
	parked := func(n int) {
		t.Helper()
		waitFor(t, 120*time.Second, fmt.Sprintf("%d parked sessions", n), func() error {
			if got := p.srv.ParkedSessions(); got != n {
				return fmt.Errorf("%d parked", got)
			}
			return nil
		})
	}
	// One session first, so that what the runtime and the pool set up once is not counted.
	child.command(t, "open 1")
	parked(1)
	before := liveMemory()
	for opened := 0; opened < idleTxSessions; opened += idleTxBatch {
		child.command(t, "open "+strconv.Itoa(idleTxBatch))
		parked(1 + opened + idleTxBatch)
	}
	after := liveMemory()
	perSession := (int64(after) - int64(before)) / idleTxSessions
	t.Logf("proxy memory per idle session in transaction mode: %d bytes (%.1f KiB), %d sessions",
		perSession, float64(perSession)/1024, idleTxSessions)
	if perSession > maxIdleTxSessionMemory {
		t.Fatalf("%d bytes per idle session in transaction mode, bound %d", perSession, maxIdleTxSessionMemory)
	}
	// Every parked session wakes up for a query and parks again.
	child.command(t, "query")
	parked(1 + idleTxSessions)
}

// raiseFileLimit raises the soft limit of open files to at least n, failing when the
// hard limit is lower (skipping outside CI).
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		msg := fmt.Sprintf("needs %d open files, the hard limit is %d", n, lim.Max)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
}

// Environment of the child process of startIdleTxClients.
const (
	idleTxAddrEnv = "LEAFPROXY_IDLE_TX_ADDR"
	idleTxUserEnv = "LEAFPROXY_IDLE_TX_USER"
	idleTxDBEnv   = "LEAFPROXY_IDLE_TX_DB"
)

// idleTxChild is the child process holding the clients of TestIdleTxSessionMemory.
type idleTxChild struct {
	in    io.WriteCloser
	lines *bufio.Scanner
}

// startIdleTxClients starts the child process; it ends when the test does.
func startIdleTxClients(t *testing.T, addr, user, database string) *idleTxChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIdleTxClients$", "-test.v")
	cmd.Env = append(os.Environ(), idleTxAddrEnv+"="+addr, idleTxUserEnv+"="+user, idleTxDBEnv+"="+database)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		if err := cmd.Wait(); err != nil {
			t.Errorf("client process: %v", err)
		}
	})
	return &idleTxChild{in: stdin, lines: bufio.NewScanner(stdout)}
}

// command has the child process run one command and waits until it is done.
func (ch *idleTxChild) command(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(ch.in, cmd); err != nil {
		t.Fatal(err)
	}
	for ch.lines.Scan() {
		switch line := ch.lines.Text(); {
		case line == "done":
			return
		case len(line) > 6 && line[:6] == "error ":
			t.Fatalf("client process, %s: %s", cmd, line[6:])
		}
	}
	t.Fatalf("the client process ended during %q", cmd)
}

// TestIdleTxClients is the child process of startIdleTxClients: it reads commands from
// its standard input ("open N": open N sessions and leave them idle; "query": run
// SELECT 1 on every session) and prints "done" after each. Run by itself, it does
// nothing.
func TestIdleTxClients(t *testing.T) {
	addr := os.Getenv(idleTxAddrEnv)
	if addr == "" {
		return // run by itself: only the child process of TestIdleTxSessionMemory has work
	}
	startup := startupPacket(map[string]string{"user": os.Getenv(idleTxUserEnv), "database": os.Getenv(idleTxDBEnv)})
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	run := func(cmd string) error {
		if n, ok := strings.CutPrefix(cmd, "open "); ok {
			count, err := strconv.Atoi(n)
			if err != nil {
				return err
			}
			for range count {
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					return err
				}
				clients = append(clients, c)
				if err := awaitReady(c, startup); err != nil {
					return err
				}
			}
			return nil
		}
		if cmd == "query" {
			for _, c := range clients {
				if err := simpleQuery(c, "SELECT 1"); err != nil {
					return err
				}
			}
			return nil
		}
		return fmt.Errorf("unknown command %q", cmd)
	}
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		if err := run(lines.Text()); err != nil {
			fmt.Println("error " + err.Error())
			return
		}
		fmt.Println("done")
	}
}

// simpleQuery sends a Query on a bare connection and reads up to its ReadyForQuery,
// failing on an ErrorResponse.
func simpleQuery(c net.Conn, sql string) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(noDeadline)
	if _, err := c.Write(appendQuery(nil, sql)); err != nil {
		return err
	}
	r := bufio.NewReaderSize(c, 512)
	var h [5]byte
	failed := ""
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return err
		}
		body := make([]byte, int(h[1])<<24|int(h[2])<<16|int(h[3])<<8|int(h[4])-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		switch h[0] {
		case serverErrorResponse:
			failed = string(errorField(body, fieldMessage))
		case serverReadyForQuery:
			if failed != "" {
				return fmt.Errorf("%s: %s", sql, failed)
			}
			return nil
		}
	}
}
