package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// runScript starts scripts/run.sh (what `make run` runs) with its ports and data
// directory moved out of the way of a developer's own `make run`.
func runScript(t *testing.T, env []string, args ...string) (*exec.Cmd, *syncBuffer, chan error) {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "..", "scripts", "run.sh"), args...)
	cmd.Env = append(cleanEnv(), env...)
	out := newSyncBuffer()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, out, done
}

// TestMakeRun runs scripts/run.sh twice on one data directory: the first run creates the
// cluster, the demo tags and table, the second reuses them; both serve IDs.
func TestMakeRun(t *testing.T) {
	t.Parallel()
	if testenv.FindPostgresBin() == "" {
		testenv.PostgresURL(t) // skips, or fails under CI, with the reason
	}
	// Not t.TempDir(): when the tests run as root, PostgreSQL runs as the postgres user,
	// who must be able to reach the directory.
	runDir, err := os.MkdirTemp("", "leafproxy-run-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(runDir, 0o755)
	pgPort, _ := testenv.FreePort()
	listen, httpAddr := freeAddr(t), freeAddr(t)
	env := []string{
		"LEAFPROXY_RUN_DIR=" + runDir, "LEAFPROXY_RUN_PGPORT=" + strconv.Itoa(pgPort),
		"LEAFPROXY_LISTEN=" + listen, "LEAFPROXY_HTTP=" + httpAddr, "LEAFPROXY_RUN_BIN=" + binPath,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join("..", "..", "scripts", "run.sh"), "--reset")
		cmd.Env = append(cleanEnv(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("run.sh --reset: %v\n%s", err, out)
		}
		os.RemoveAll(runDir)
	})

	for round, wantLog := range []string{"creating a PostgreSQL cluster", "reusing PostgreSQL"} {
		cmd, out, done := runScript(t, env)
		s := &server{t: t, http: "http://" + httpAddr, listen: listen, log: out, done: make(chan struct{})}
		go func() {
			if ee, ok := (<-done).(*exec.ExitError); ok {
				s.exitCode = ee.ExitCode()
			}
			close(s.done)
		}()
		waitReady(s)
		// Every step says what it does.
		for _, w := range []string{wantLog, "run: applying the migrations (leaf_alloc, leaf_worker_lease)",
			"run: creating the demo tag audit and the table orders (scripts/demo.sql)"} {
			if !strings.Contains(out.String(), w) {
				t.Errorf("round %d: output lacks %q:\n%s", round, w, out.String())
			}
		}
		host, port, _ := strings.Cut(listen, ":")
		want := `psql -h ` + host + ` -p ` + port + ` -U postgres -c "select leaf_next('order')"`
		if !strings.Contains(out.String(), want) {
			t.Errorf("round %d: output does not print %s:\n%s", round, want, out.String())
		}
		code, body := s.get("/api/segment/get/audit", "")
		if id, err := strconv.ParseInt(body, 10, 64); code != 200 || err != nil || id < 2 {
			t.Errorf("round %d: demo segment tag audit: %d %q", round, code, body)
		}
		if _, body := s.get("/", ""); !strings.Contains(body, "<td>order</td><td>snowflake</td>") || !strings.Contains(body, "orders.id=order") {
			t.Errorf("round %d: status page lacks the demo snowflake tag or fill rule", round)
		}
		// The line the script prints works, and the demo fill rule fills orders.id.
		psql := filepath.Join(testenv.FindPostgresBin(), "psql")
		for _, sql := range []string{
			"select leaf_next('order')",
			"select leaf_next('audit')",
			"insert into orders (item) values ('book') returning id",
		} {
			q := exec.Command(psql, "-X", "-At", "-h", host, "-p", port, "-U", "postgres", "-c", sql)
			var qout bytes.Buffer
			q.Stdout, q.Stderr = &qout, &qout
			err := q.Run()
			if id, perr := strconv.ParseInt(strings.TrimSpace(strings.Split(qout.String(), "\n")[0]), 10, 64); err != nil || perr != nil || id <= 0 {
				t.Errorf("round %d: psql -c %q through the proxy: %v %q", round, sql, err, qout.String())
			}
		}
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Fatal("run.sh did not stop on SIGINT")
		}
		if resp, err := http.Get(s.http + "/healthz"); err == nil {
			resp.Body.Close()
			t.Fatalf("round %d: the proxy still answers after SIGINT", round)
		}
	}
}
