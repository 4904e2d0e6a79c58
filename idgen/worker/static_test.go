package worker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/leafproxy/leafproxy/idgen/worker"
)

// acquire takes a lease from src, failing the test on error, and closes it at the end.
func acquire(t *testing.T, src worker.Static) worker.Lease {
	t.Helper()
	l, err := src.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire(%+v): %v", src, err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

func quiet() worker.Static {
	log, _ := test.NewNullLogger()
	return worker.Static{Logger: log}
}

func statePath(dir string, id string) string { return filepath.Join(dir, "worker-"+id+".highwater") }

func TestStaticStateFileRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content *string // nil: no file
		want    int64
		bad     string // substring of an ErrBadState error
	}{
		{"no file", nil, 0, ""},
		{"written by us", ptr("workerID=5\ntimestamp=1767225600000\n"), 1767225600000, ""},
		{"comments and spaces", ptr("# leafproxy\n\n workerID = 5 \ntimestamp=42"), 42, ""},
		{"empty", ptr(""), 0, "want workerID and timestamp"},
		{"no timestamp", ptr("workerID=5\n"), 0, "want workerID and timestamp"},
		{"no worker ID", ptr("timestamp=42\n"), 0, "want workerID and timestamp"},
		{"another worker", ptr("workerID=6\ntimestamp=42\n"), 0, "for worker ID 6, not 5"},
		{"garbage", ptr("\x00\x01\x02"), 0, "not key=value"},
		{"torn number", ptr("workerID=5\ntimestamp=17672x\n"), 0, `timestamp "17672x"`},
		{"negative", ptr("workerID=5\ntimestamp=-1\n"), 0, "non-negative"},
		{"unknown key", ptr("workerID=5\ntimestamp=1\nepoch=3\n"), 0, `unknown key "epoch"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != nil {
				if err := os.WriteFile(statePath(dir, "5"), []byte(*tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			src := quiet()
			src.ID, src.StateDir = 5, dir
			l, err := src.Acquire(context.Background())
			if tc.bad != "" {
				if !errors.Is(err, worker.ErrBadState) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("Acquire = %v, want ErrBadState saying %q", err, tc.bad)
				}
				// A refused start keeps no lock: the next attempt reports the file again.
				if _, err := src.Acquire(context.Background()); !errors.Is(err, worker.ErrBadState) {
					t.Fatalf("second Acquire = %v, want ErrBadState again", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close(context.Background())
			if l.HighWater() != tc.want || l.WorkerID() != 5 || !l.ValidUntil().IsZero() || l.Done() != nil {
				t.Fatalf("lease: high-water %d (want %d), id %d", l.HighWater(), tc.want, l.WorkerID())
			}
		})
	}
}

func ptr(s string) *string { return &s }

// readMark returns the timestamp in the state file of worker id in dir; false when there
// is no file.
func readMark(t *testing.T, dir, id string) (int64, bool) {
	t.Helper()
	data, err := os.ReadFile(statePath(dir, id))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "timestamp="); ok {
			ts, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("state file %q: %v", data, err)
			}
			return ts, true
		}
	}
	t.Fatalf("state file %q has no timestamp", data)
	return 0, false
}

func TestStaticCloseWritesTheLargestRecorded(t *testing.T) {
	dir := t.TempDir()
	src := quiet()
	src.ID, src.StateDir, src.ReportInterval = 5, dir, time.Hour
	l, err := src.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := readMark(t, dir, "5"); ok {
		t.Fatal("Acquire wrote a state file before anything was recorded")
	}
	l.Record(1000)
	l.Record(1500)
	l.Record(1200) // late and smaller: must not lower the mark
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := readMark(t, dir, "5"); got != 1500 {
		t.Fatalf("mark after Close = %d, want 1500", got)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	next := acquire(t, src)
	if next.HighWater() != 1500 {
		t.Fatalf("next run's high-water = %d, want 1500", next.HighWater())
	}
	// Nothing recorded in a run: the file keeps the old mark.
	if err := next.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := readMark(t, dir, "5"); got != 1500 {
		t.Fatalf("mark after an idle run = %d, want 1500", got)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestStaticWritesEveryInterval(t *testing.T) {
	dir := t.TempDir()
	src := quiet()
	src.ID, src.StateDir, src.ReportInterval = 5, dir, 10*time.Millisecond
	l := acquire(t, src)
	for _, ms := range []int64{2000, 3000} {
		l.Record(ms)
		deadline := time.Now().Add(5 * time.Second)
		for {
			if got, _ := readMark(t, dir, "5"); got == ms {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the mark %d was not written within 5 s of being recorded", ms)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func TestStaticLock(t *testing.T) {
	dir := t.TempDir()
	src := quiet()
	src.ID, src.StateDir = 5, dir
	first, err := src.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Acquire(context.Background())
	if !errors.Is(err, worker.ErrInUse) || !strings.Contains(err.Error(), "worker-5.lock") {
		t.Fatalf("second Acquire of worker 5 = %v, want ErrInUse naming the lock file", err)
	}
	other := src
	other.ID = 6
	acquire(t, other) // another ID in the same directory is fine
	acquire(t, worker.Static{ID: 5, StateDir: t.TempDir()})

	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	acquire(t, src) // released by Close
}

func TestStaticReportsWriteErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var failures atomic.Int64
	src := quiet()
	src.ID, src.StateDir, src.ReportInterval = 5, dir, time.Hour
	src.Hooks.OnReportError = func(id int64, err error) {
		if id == 5 && err != nil {
			failures.Add(1)
		}
	}
	l, err := src.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The directory vanishes under the running lease: the last write cannot happen.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	l.Record(1000)
	if err := l.Close(context.Background()); err == nil || !strings.Contains(err.Error(), "high-water mark of static worker 5") {
		t.Fatalf("Close = %v, want the failed write", err)
	}
	if failures.Load() != 1 {
		t.Fatalf("OnReportError called %d times, want 1", failures.Load())
	}
}

func TestStaticStateDirIsAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (worker.Static{ID: 1, StateDir: file}).Acquire(context.Background()); err == nil {
		t.Fatal("Acquire with a file as the state directory succeeded")
	}
}
