package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
)

// TestStaticWorkerStateFile runs serve with a static worker ID: the time high-water mark
// lands in the state directory (the configured one, or {TMPDIR}/leafproxy by default) and
// is at least the millisecond of the last ID issued when SIGTERM stopped the proxy; a
// second proxy with the same ID and directory refuses to start; a restart with the clock
// an hour behind the mark refuses to start, and a normal restart issues above the mark.
func TestStaticWorkerStateFile(t *testing.T) {
	t.Parallel()
	clockBin := testClockBinary(t)
	dsn := newStore(t)
	for _, tc := range []struct {
		name string
		dir  func(tmp string) (flag []string, stateDir string)
	}{
		{"worker-state-dir", func(string) ([]string, string) {
			d := filepath.Join(t.TempDir(), "state")
			return []string{"--worker-state-dir", d}, d
		}},
		{"default under TMPDIR", func(tmp string) ([]string, string) { return nil, filepath.Join(tmp, "leafproxy") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			env := []string{"TMPDIR=" + tmp}
			flags, stateDir := tc.dir(tmp)
			args := serveArgs(t, dsn, 31, flags...)

			s := startServe(t, env, args...)
			waitReady(s)
			var last int64
			for i := 0; i < 20; i++ {
				code, body := s.get("/api/snowflake/get/order", "")
				id, err := strconv.ParseInt(body, 10, 64)
				if code != 200 || err != nil || id <= last {
					t.Fatalf("snowflake ID %d: %d %q", i, code, body)
				}
				last = id
			}

			// Same worker ID, same directory, while the first proxy runs.
			r := leafproxy(t, env, append([]string{"serve", "--listen", freeAddr(t), "--http", freeAddr(t)}, args...)...)
			if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "another process runs with static worker ID 31") {
				t.Errorf("second proxy with worker ID 31: exit %d, want a refusal naming the lock\n%s%s", r.code, r.stdout, r.stderr)
			}

			s.stop()
			lastMillis := snowflake.DefaultCodec().Decompose(last).Time.UnixMilli()
			mark := stateMark(t, filepath.Join(stateDir, "worker-31.highwater"), 31)
			if mark < lastMillis {
				t.Fatalf("state file holds %d, below the last ID's millisecond %d", mark, lastMillis)
			}

			// The clock an hour behind the mark: no IDs at all.
			r = runBinary(t, clockBin, append(env, "LEAFPROXY_TEST_CLOCK_OFFSET=-1h"),
				append([]string{"serve", "--listen", freeAddr(t), "--http", freeAddr(t)}, args...)...)
			if r.code == 0 || !strings.Contains(r.stderr+r.stdout, "clock moved backwards") {
				t.Errorf("restart with the clock an hour behind: exit %d, want the clock error\n%s%s", r.code, r.stdout, r.stderr)
			}

			s = startServe(t, env, args...)
			waitReady(s)
			code, body := s.get("/api/snowflake/get/order", "")
			id, err := strconv.ParseInt(body, 10, 64)
			if code != 200 || err != nil || id <= last {
				t.Fatalf("first ID after the restart: %d %q, want one above %d", code, body, last)
			}
			s.stop()
		})
	}
}

// stateMark reads the timestamp of a static worker's state file, checking its worker ID.
func stateMark(t *testing.T, path string, workerID int64) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("state file: %v", err)
	}
	props := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, ok := strings.Cut(line, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			t.Fatalf("state file %s: bad line %q", path, line)
		}
		props[k] = n
	}
	if props["workerID"] != workerID || len(props) != 2 {
		t.Fatalf("state file %s = %q, want workerID=%d and a timestamp", path, data, workerID)
	}
	return props["timestamp"]
}

// runBinary is leafproxy with another build of the command.
func runBinary(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cleanEnv(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %s %v: %v", bin, args, err)
	}
	return r
}
