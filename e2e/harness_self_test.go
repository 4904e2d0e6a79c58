package e2e

import (
	"errors"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The harness's own pieces are checked here, without servers, so that a passing
// end-to-end run cannot come from a checker that sees nothing.

func TestCollectorFindsDuplicates(t *testing.T) {
	c := NewCollector()
	c.Add(IDRow{Namespace: "a", ID: 1, Proxy: "p1"})
	c.Add(IDRow{Namespace: "b", ID: 1, Proxy: "p1"}) // other namespace: no duplicate
	c.Add(IDRow{Namespace: "a", ID: 2, Proxy: "p2"})
	if d := c.Duplicates(); len(d) != 0 {
		t.Fatalf("duplicates before any: %v", d)
	}
	c.Add(IDRow{Namespace: "a", ID: 1, Proxy: "p2"})
	if d := c.Duplicates(); len(d) != 1 {
		t.Fatalf("duplicates = %v, want one", d)
	}
	if c.Len() != 3 {
		t.Errorf("Len = %d, want 3 distinct", c.Len())
	}
}

func TestDecodeSnowflake(t *testing.T) {
	at := time.UnixMilli(snowflakeEpochMS + 123456789)
	for _, tc := range []struct{ worker, seq int64 }{{0, 0}, {1023, 4095}, {517, 99}} {
		id := (123456789 << 22) | tc.worker<<12 | tc.seq
		gotAt, w, s := decodeSnowflake(id)
		if !gotAt.Equal(at) || w != tc.worker || s != tc.seq {
			t.Errorf("decode(%d) = %v %d %d, want %v %d %d", id, gotAt, w, s, at, tc.worker, tc.seq)
		}
	}
}

func TestIsConnError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{io.EOF, true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "42704"}, false},
		{&pgconn.PgError{Code: "58000"}, false},
		{errors.New("wrong data: something"), false},
		{nil, false},
	} {
		if got := isConnError(tc.err); got != tc.want {
			t.Errorf("isConnError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"00000000:0016":                         "0.0.0.0:22",
		"00000000000000000000000001000000:1F90": "[::1]:8080",
		"00000000000000000000000000000000:0050": "[::]:80",
	} {
		if got := procAddr(in); got != want {
			t.Errorf("procAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

// snowflakeAt composes an ID of the default layout, for checks of the checkers.
func snowflakeAt(at time.Time, worker, seq int64) int64 {
	return (at.UnixMilli()-snowflakeEpochMS)<<(workerBits+sequenceBits) | worker<<sequenceBits | seq
}

func TestWorkerOverlapsFindsTwoHoldersAtOnce(t *testing.T) {
	t0 := time.Now().Truncate(time.Millisecond)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	add := func(c *Collector, proxy string, run int, at time.Time, worker, seq int64) {
		c.Add(IDRow{Namespace: snowflakeNamespace, ID: snowflakeAt(at, worker, seq), Proxy: proxy, Run: run})
	}
	for _, tt := range []struct {
		name   string
		bFirst int // B's first millisecond; A issues worker 5 at ms 0..10
		want   int
	}{
		{"B after A", 11, 0},
		{"B in A's last millisecond", 10, 1},
		{"B inside A's span", 5, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCollector()
			add(c, "A", 1, ms(0), 5, 0)
			add(c, "A", 1, ms(10), 5, 0)
			add(c, "B", 1, ms(tt.bFirst), 5, 1)
			add(c, "B", 1, ms(tt.bFirst+20), 5, 0)
			add(c, "B", 2, ms(tt.bFirst+5), 6, 0) // another worker ID: never an overlap
			add(c, "C", 0, ms(5), 5, 7)           // unknown run: left out
			if got := c.WorkerOverlaps(); len(got) != tt.want {
				t.Errorf("overlaps %q, want %d", got, tt.want)
			}
		})
	}
	c := NewCollector()
	at, w, seq := decodeSnowflake(snowflakeAt(t0, 1023, 4095))
	if !at.Equal(t0) || w != 1023 || seq != 4095 {
		t.Errorf("snowflakeAt and decodeSnowflake disagree: %v %d %d", at, w, seq)
	}
	add(c, "A", 1, ms(0), 5, 0)
	add(c, "A", 2, ms(1), 5, 0) // the next run, after the last ID of the one before
	if got := c.WorkerOverlaps(); len(got) != 0 {
		t.Errorf("A run 1 at ms 0, A run 2 at ms 1: overlaps %q, want none", got)
	}
}

func TestRunningThreadsSeesAStoppedProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	if n, err := runningThreads(pid); err != nil || n != 1 {
		t.Fatalf("a sleeping process: %d running threads, %v; want 1", n, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := runningThreads(pid)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d threads still counted as running 10 s after SIGSTOP", n)
		}
		<-time.After(time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}
