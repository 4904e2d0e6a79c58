package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// binPath is the leafproxy binary TestMain builds once for the package's tests.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "leafproxy-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "leafproxy")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build leafproxy:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one run of the binary printed and how it exited.
type result struct {
	stdout, stderr string
	code           int
}

// leafproxy runs the binary to completion with env added to a clean environment (no
// LEAFPROXY_* variables leak in from the developer's shell).
func leafproxy(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(cleanEnv(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run leafproxy %v: %v", args, err)
	}
	return r
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEAFPROXY_") {
			env = append(env, kv)
		}
	}
	return env
}

// mustRun runs the binary and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := leafproxy(t, nil, args...)
	if r.code != 0 {
		t.Fatalf("leafproxy %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// server is one `leafproxy serve` process.
type server struct {
	t        *testing.T
	cmd      *exec.Cmd
	http     string // base URL of the admin server
	listen   string
	log      *syncBuffer
	done     chan struct{}
	exitCode int
}

type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

// freeAddr returns 127.0.0.1:port with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// upstreamOf returns host:port of a PostgreSQL URL.
func upstreamOf(t *testing.T, dsn string) string {
	t.Helper()
	rest := dsn[strings.Index(dsn, "@")+1:]
	return rest[:strings.IndexAny(rest, "/?")]
}

// startServe starts `leafproxy serve` with the given flags (plus --listen and --http on
// free ports unless given) and waits until /healthz answers.
func startServe(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	return startServeBinary(t, binPath, env, args...)
}

// startServeBinary is startServe with another build of the command.
func startServeBinary(t *testing.T, bin string, env []string, args ...string) *server {
	t.Helper()
	s := &server{t: t, log: newSyncBuffer(), done: make(chan struct{})}
	joined := " " + strings.Join(args, " ") + " "
	if !strings.Contains(joined, " --listen ") {
		s.listen = freeAddr(t)
		args = append(args, "--listen", s.listen)
	}
	httpAddr := ""
	for i, a := range args {
		if a == "--http" && i+1 < len(args) {
			httpAddr = args[i+1]
		}
	}
	if httpAddr == "" {
		httpAddr = freeAddr(t)
		args = append(args, "--http", httpAddr)
	}
	s.http = "http://" + httpAddr
	s.cmd = exec.Command(bin, append([]string{"serve"}, args...)...)
	s.cmd.Env = append(append(cleanEnv(), "TMPDIR="+t.TempDir()), env...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := s.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			s.exitCode = ee.ExitCode()
		}
		close(s.done)
	}()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
		if t.Failed() {
			t.Logf("leafproxy serve log:\n%s", s.log.String())
		}
	})
	s.waitFor("/healthz answers", func() bool {
		code, _ := s.get("/healthz", "")
		return code == http.StatusOK
	})
	return s
}

// waitFor polls cond until it holds, failing the test after 90 s or when serve exits. The
// deadline is generous: on a loaded machine initdb and a server start alone take half a
// minute.
func (s *server) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		select {
		case <-s.done:
			s.t.Fatalf("leafproxy serve exited (code %d) while waiting for %s:\n%s", s.exitCode, what, s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get fetches path from the admin server; code 0 means the request failed.
func (s *server) get(path, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, s.http+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// stop sends SIGTERM and waits for a clean exit.
func (s *server) stop() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.t.Fatal("serve did not exit within 30 s of SIGTERM")
	}
	if s.exitCode != 0 {
		s.t.Fatalf("serve exited with %d after SIGTERM:\n%s", s.exitCode, s.log.String())
	}
}
