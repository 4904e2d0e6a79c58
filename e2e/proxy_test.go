package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// ProxyConfig is what one leafproxy serve process is started with. Listen and HTTP ports
// are chosen by StartProxy and kept across restarts, so a restarted proxy has the same
// ip:port identity (the ZooKeeper worker source keys its node on it).
type ProxyConfig struct {
	Binary        string   // the leafproxy binary; default the one TestMain built
	Upstream      string   // host:port of PostgreSQL
	Store         string   // DSN for leaf_alloc and leases
	WorkerSource  string   // static, postgres or zookeeper; "" leaves the binary's default
	WorkerID      int      // for static; ignored otherwise
	ZK            []string // ZooKeeper servers, host:port
	SnowflakeTags []string
	Fill          []string // table.column=tag
	Extra         []string // more flags, verbatim
	Env           []string // more environment, KEY=value
	// TempDir becomes the process's TMPDIR: the ZooKeeper worker source keeps its worker-ID
	// cache under os.TempDir(), so a test that restarts a proxy keeps the same TempDir.
	// Default: a fresh directory per proxy.
	TempDir string
	// HTTPToken is passed as --http-token and sent by the readiness probe.
	HTTPToken string
	// HTTPAddr overrides the admin listen address (default 127.0.0.1 and a free port);
	// "-" leaves --http out entirely.
	HTTPAddr string
}

// Proxy is one leafproxy serve process the test controls.
type Proxy struct {
	t          testing.TB
	Name       string
	cfg        ProxyConfig
	ListenPort int
	HTTPPort   int
	logPath    string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	starts  int
}

// StartProxy starts leafproxy serve and waits until it is ready.
func StartProxy(t testing.TB, name string, cfg ProxyConfig) *Proxy {
	t.Helper()
	p := NewProxy(t, name, cfg)
	p.Start()
	return p
}

// NewProxy prepares a proxy (ports, directories) without starting it.
func NewProxy(t testing.TB, name string, cfg ProxyConfig) *Proxy {
	t.Helper()
	leafproxyBin(t)
	p := &Proxy{t: t, Name: name, cfg: cfg}
	var err error
	if p.ListenPort, err = testenv.FreePort(); err != nil {
		t.Fatal(err)
	}
	if p.HTTPPort, err = testenv.FreePort(); err != nil {
		t.Fatal(err)
	}
	if p.cfg.TempDir == "" {
		p.cfg.TempDir = t.TempDir()
	}
	p.logPath = filepath.Join(t.TempDir(), name+".log")
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("last lines of proxy %s's log:\n%s", p.Name, p.LogTail(80))
		}
	})
	return p
}

var notInBuild = regexp.MustCompile(`[^\n"]*is not available in this build[^\n"]*`)

// Addr is the proxy's PostgreSQL listen address.
func (p *Proxy) Addr() string { return fmt.Sprintf("127.0.0.1:%d", p.ListenPort) }

// HTTPURL is the base URL of the admin server.
func (p *Proxy) HTTPURL() string { return fmt.Sprintf("http://127.0.0.1:%d", p.HTTPPort) }

// TempDir is the proxy's TMPDIR.
func (p *Proxy) TempDir() string { return p.cfg.TempDir }

// URL returns a connection URL through the proxy for the database of dbURL, as user.
func (p *Proxy) URL(dbURL, user, password string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		p.t.Fatalf("parse %q: %v", dbURL, err)
	}
	u.Host = p.Addr()
	if password == "" {
		u.User = url.User(user)
	} else {
		u.User = url.UserPassword(user, password)
	}
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String()
}

func (p *Proxy) args() []string {
	c := p.cfg
	a := []string{"serve", "--listen", p.Addr()}
	if c.Upstream != "" {
		a = append(a, "--upstream", c.Upstream)
	}
	if c.Store != "" {
		a = append(a, "--store", c.Store)
	}
	switch c.HTTPAddr {
	case "":
		a = append(a, "--http", fmt.Sprintf("127.0.0.1:%d", p.HTTPPort))
	case "-":
	default:
		a = append(a, "--http", c.HTTPAddr)
	}
	if c.HTTPToken != "" {
		a = append(a, "--http-token", c.HTTPToken)
	}
	if c.WorkerSource != "" {
		a = append(a, "--worker-source", c.WorkerSource)
	}
	if c.WorkerSource == "static" {
		a = append(a, "--worker-id", strconv.Itoa(c.WorkerID))
	}
	if len(c.ZK) > 0 {
		a = append(a, "--zk", strings.Join(c.ZK, ","))
	}
	if len(c.SnowflakeTags) > 0 {
		a = append(a, "--snowflake-tags", strings.Join(c.SnowflakeTags, ","))
	}
	for _, f := range c.Fill {
		a = append(a, "--fill", f)
	}
	return append(a, c.Extra...)
}

// Start starts the process (again) and waits until it is ready.
func (p *Proxy) Start() time.Duration {
	p.t.Helper()
	began := time.Now()
	p.Spawn()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		// The command says so itself when a feature (a worker source, say) is not built
		// in yet: that is a missing feature, not a failure of one.
		if m := notInBuild.FindString(p.LogTail(20)); m != "" {
			testenv.SkipOrFail(p.t, "proxy %s: the binary says %q", p.Name, m)
		}
		p.t.Fatalf("proxy %s: %v\nlog:\n%s", p.Name, err, p.LogTail(60))
	}
	return time.Since(began)
}

// Spawn starts the process without waiting for readiness.
func (p *Proxy) Spawn() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatalf("proxy %s already runs", p.Name)
	}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	p.starts++
	fmt.Fprintf(log, "==== start %d: leafproxy %s\n", p.starts, strings.Join(p.args(), " "))
	bin := p.cfg.Binary
	if bin == "" {
		bin = leafproxyBin(p.t)
	}
	cmd := exec.Command(bin, p.args()...)
	cmd.Env = append(append(os.Environ(), "TMPDIR="+p.cfg.TempDir), p.cfg.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Pdeathsig: a test binary that dies must not leave proxies behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		p.t.Fatalf("start proxy %s: %v", p.Name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		log.Close()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
}

// Starts returns how many times the process was started: the number of the current run.
func (p *Proxy) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Pid returns the running process's pid, or 0.
func (p *Proxy) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// exited reports whether the process has ended, with its wait error.
func (p *Proxy) exited() (bool, error) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true, errors.New("not started")
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.waitErr
	default:
		return false, nil
	}
}

// WaitReady polls GET /readyz until it answers 200. When the binary has no /readyz (404)
// or no admin server, readiness is the listen port accepting connections.
func (p *Proxy) WaitReady(ctx context.Context) error {
	client := &http.Client{Timeout: 10 * time.Second}
	var last error
	for {
		if gone, err := p.exited(); gone {
			return fmt.Errorf("exited before it was ready: %v", err)
		}
		last = p.readyOnce(client)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *Proxy) readyOnce(client *http.Client) error {
	if p.cfg.HTTPAddr != "-" {
		req, err := http.NewRequest(http.MethodGet, p.HTTPURL()+"/readyz", nil)
		if err != nil {
			return err
		}
		if p.cfg.HTTPToken != "" {
			req.Header.Set("Authorization", "Bearer "+p.cfg.HTTPToken)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return nil
			case http.StatusNotFound:
			default:
				return fmt.Errorf("/readyz: %s %s", resp.Status, strings.TrimSpace(string(body)))
			}
		} else if p.cfg.HTTPAddr == "" {
			return err
		}
	}
	conn, err := net.DialTimeout("tcp", p.Addr(), 10*time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Kill sends SIGKILL (a crash) and waits for the process to end. No-op when not running.
func (p *Proxy) Kill() {
	p.signalAndWait(syscall.SIGKILL, 30*time.Second)
}

// Terminate sends SIGTERM (a graceful shutdown) and returns how long the process took to
// exit and its exit error; it fails the test when the process outlives timeout.
func (p *Proxy) Terminate(timeout time.Duration) (time.Duration, error) {
	p.t.Helper()
	began := time.Now()
	ok, err := p.signalAndWait(syscall.SIGTERM, timeout)
	if !ok {
		p.t.Errorf("proxy %s still runs %v after SIGTERM; killed it", p.Name, timeout)
		p.Kill()
	}
	return time.Since(began), err
}

func (p *Proxy) signalAndWait(sig syscall.Signal, timeout time.Duration) (bool, error) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return true, nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(timeout):
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd, p.done = nil, nil
	return true, p.waitErr
}

// Signal sends sig (SIGSTOP, SIGCONT…). For SIGSTOP it returns only once every thread of
// the process has stopped: the kernel stops a process asynchronously, and a test that sends
// queries right after SIGSTOP must not have them answered by a process still running.
func (p *Proxy) Signal(sig syscall.Signal) {
	p.t.Helper()
	pid := p.Pid()
	if pid == 0 {
		return
	}
	if err := syscall.Kill(pid, sig); err != nil {
		p.t.Fatalf("signal %v to proxy %s: %v", sig, p.Name, err)
	}
	if sig != syscall.SIGSTOP {
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		running, err := runningThreads(pid)
		if err == nil && running == 0 {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("proxy %s: %d threads still run 10 s after SIGSTOP (%v)", p.Name, running, err)
		}
		<-time.After(time.Millisecond)
	}
}

// runningThreads counts the threads of process pid that are not stopped, from the state
// field of /proc/<pid>/task/<tid>/stat ("T": stopped by a signal).
func runningThreads(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	running := 0
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		// The command name in parentheses may hold spaces: the state follows the last ')'.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(fields) == 0 || fields[0] != "T" {
			running++
		}
	}
	return running, nil
}

// RSS returns the process's resident set size in bytes (VmRSS of /proc/<pid>/status).
func (p *Proxy) RSS() (int64, error) {
	pid := p.Pid()
	if pid == 0 {
		return 0, errors.New("proxy not running")
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(v)
			if len(fields) != 2 || fields[1] != "kB" {
				return 0, fmt.Errorf("odd VmRSS line %q", sc.Text())
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// HTTPGet requests path on the admin server and returns status and body.
func (p *Proxy) HTTPGet(path string, header http.Header) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, p.HTTPURL()+path, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

// LogTail returns the last n lines the process printed (over all its starts).
func (p *Proxy) LogTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Log returns everything the process printed.
func (p *Proxy) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// hostPort returns host:port of a postgres:// URL.
func hostPort(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse %q: %v", rawURL, err)
	}
	return u.Host
}
