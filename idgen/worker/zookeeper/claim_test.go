package zookeeper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

func startEngine(t *testing.T, s snowflake.Settings) *snowflake.Engine {
	t.Helper()
	e, err := snowflake.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { e.Close(ctx) })
	return e
}

// Two live processes advertising the same ip:port (two hosts behind one bridge address):
// the second finds the first's liveness claim, issues no ID while the first lives (the
// first's worker ID is the only one its node gives), says who holds it, and takes over
// when the first stops, after the first's last timestamp.
func TestSameAddressSecondProcessWaitsForTheFirst(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	s1 := settings(t, addr, name, "7001")
	s1.ReportInterval = 100 * time.Millisecond
	s2 := s1
	s2.CacheDir = t.TempDir() // another host
	log2, logs2 := test.NewNullLogger()
	s2.Logger = log2

	first := startEngine(t, snowflake.Settings{Source: newSource(t, s1), Logger: s1.Logger})
	var last int64
	for range 100 {
		id, err := first.Next(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		last = id
	}
	second := startEngine(t, snowflake.Settings{Source: newSource(t, s2), Logger: log2, RetryBackoff: 50 * time.Millisecond})
	w := first.Info().WorkerID
	if in := second.Info(); in.WorkerID != w || in.Held {
		t.Fatalf("second process: %+v, want worker %d not held", in, w)
	}

	// Both run: the first issues, the second refuses every time.
	for range 200 {
		if id, err := second.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
			t.Fatalf("the second process issued %d (%v) while the first holds worker %d", id, err, w)
		}
		id, err := first.Next(ctx, "")
		if err != nil {
			t.Fatalf("the first process: %v", err)
		}
		last = id
	}
	var named bool
	for _, en := range logs2.AllEntries() {
		if en.Level == logrus.ErrorLevel && strings.Contains(en.Message, "another live process holds this worker ID") {
			h, _ := en.Data["holder"].(string)
			named = strings.Contains(h, fmt.Sprintf("pid %d", os.Getpid()))
		}
	}
	if !named {
		t.Errorf("no error line naming the holder (pid %d) among the second process' log lines", os.Getpid())
	}
	var claim struct {
		Host string `json:"host"`
		PID  int    `json:"pid"`
	}
	raw, _, err := rawConn(t, addr).Get(fmt.Sprintf("/snowflake/%s/live/%d", name, w))
	if err != nil || json.Unmarshal(raw, &claim) != nil || claim.PID != os.Getpid() || claim.Host == "" {
		t.Fatalf("claim node holds %q (%v), want the holder's host and pid", raw, err)
	}

	lastMs := first.Decompose(last).Millis
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var took int64
	waitUntil(t, 20*time.Second, "the second process to take the worker ID over", func() bool {
		took, err = second.Next(ctx, "")
		return err == nil
	})
	if p := second.Decompose(took); p.Worker != w || p.Millis <= lastMs {
		t.Fatalf("after the first stopped the second issued %+v, want worker %d after %d ms", p, w, lastMs)
	}
	if !second.Info().Held {
		t.Fatal("the second process does not report the worker ID held after the takeover")
	}
}

// stepClock is a clock the test moves by hand, shared by the engine and the source.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	c.Add(d)
	return ctx.Err()
}

func (c *stepClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// The claim's deadline is the claim's send time plus two thirds of the session timeout,
// on the injected clock; past it the engine refuses IDs at once, before any check of the
// claim (the first is a sixth of the session timeout away) or any event has run.
func TestClaimDeadlineIsEnforcedWithoutAGoroutine(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	name := uniqueName(t, addr)
	clock := &stepClock{now: time.Now()}
	s := settings(t, addr, name, "7001")
	s.SessionTimeout = 36 * time.Second
	s.Now = clock.Now
	claimed := clock.Now()
	e := startEngine(t, snowflake.Settings{Source: newSource(t, s), Clock: clock, Logger: s.Logger})
	until := claimed.Add(24 * time.Second)

	clock.Add(24*time.Second - time.Millisecond)
	id, err := e.Next(ctx, "")
	if err != nil {
		t.Fatalf("Next a millisecond before the deadline: %v", err)
	}
	if at := time.UnixMilli(e.Decompose(id).Millis); !at.Before(until) {
		t.Fatalf("ID stamped %v, not before the deadline %v", at, until)
	}
	clock.Add(time.Millisecond) // a pause: the clock reads the deadline
	if _, err := e.Next(ctx, ""); !errors.Is(err, idgen.ErrWorkerNotHeld) {
		t.Fatalf("Next at the deadline: %v, want ErrWorkerNotHeld", err)
	}
	if e.Info().Held {
		t.Fatal("Info().Held at the deadline")
	}
}
