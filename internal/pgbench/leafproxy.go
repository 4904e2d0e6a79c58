package pgbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Leafproxy is a `leafproxy serve` process, the binary users run, listening on a free
// loopback port with its admin server on another.
type Leafproxy struct {
	Addr     string // host:port of the PostgreSQL listener
	HTTPAddr string // host:port of the admin server
	dir      string
	cmd      *exec.Cmd
	exit     *exitWatch // set once the process has started
}

// BuildLeafproxy builds the leafproxy command of this module into dir and returns the
// binary's path.
func BuildLeafproxy(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "leafproxy")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/leafproxy/leafproxy/cmd/leafproxy").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// StartLeafproxy runs `bin serve` with args (everything but --listen and --http, which it
// chooses) and waits until /readyz answers 200. The process logs to a file in its own
// directory, which the error of a failed start quotes.
func StartLeafproxy(ctx context.Context, bin string, args ...string) (*Leafproxy, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leafproxy-bench-")
	if err != nil {
		return nil, err
	}
	p := &Leafproxy{
		Addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		HTTPAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		dir:      dir,
	}
	log, err := os.Create(filepath.Join(dir, "leafproxy.log"))
	if err != nil {
		p.Close()
		return nil, err
	}
	defer log.Close()
	p.cmd = exec.Command(bin, append([]string{"serve", "--listen", p.Addr, "--http", p.HTTPAddr}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	if err := p.cmd.Start(); err != nil {
		p.Close()
		return nil, err
	}
	p.exit = watchExit(p.cmd)
	if err := p.waitReady(ctx); err != nil {
		out, _ := os.ReadFile(log.Name())
		p.Close()
		return nil, fmt.Errorf("leafproxy did not start: %w\n%s", err, out)
	}
	return p, nil
}

// waitReady waits until /readyz answers 200 or the process exits.
func (p *Leafproxy) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second}
	for {
		resp, err := client.Get("http://" + p.HTTPAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exit.done:
			return errors.Join(errors.New("process exited"), p.exit.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pid is the process's ID.
func (p *Leafproxy) Pid() int { return p.cmd.Process.Pid }

// CPU is a CPU meter of the leafproxy process.
func (p *Leafproxy) CPU() (time.Duration, error) { return ProcessCPU(p.cmd.Process.Pid)() }

// UserCPU is a meter of the leafproxy process's user CPU time.
func (p *Leafproxy) UserCPU() (time.Duration, error) { return ProcessUserCPU(p.cmd.Process.Pid)() }

// URL returns serverURL pointed at the proxy.
func (p *Leafproxy) URL(serverURL string) string { return withHost(serverURL, p.Addr) }

// Close stops the proxy (SIGTERM, a graceful shutdown) and removes its directory.
func (p *Leafproxy) Close() error {
	if p.exit != nil {
		p.exit.stop(syscall.SIGTERM, 30*time.Second)
	}
	return os.RemoveAll(p.dir)
}

// exitWatch waits for a started process. Its done channel is closed once the process has
// ended, so any number of waiters (a start-up check, then Close) see it.
type exitWatch struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the process's exit status, set before done is closed
}

func watchExit(cmd *exec.Cmd) *exitWatch {
	w := &exitWatch{cmd: cmd, done: make(chan struct{})}
	go func() {
		w.err = cmd.Wait()
		close(w.done)
	}()
	return w
}

// stop sends sig and waits for the process to end, killing it after grace.
func (w *exitWatch) stop(sig os.Signal, grace time.Duration) {
	_ = w.cmd.Process.Signal(sig)
	select {
	case <-w.done:
	case <-time.After(grace):
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

// CPUProfile takes a CPU profile of the proxy over d from its admin server (the proxy must
// run with --http-pprof) and writes it to file, for `go tool pprof`.
func (p *Leafproxy) CPUProfile(ctx context.Context, d time.Duration, file string) error {
	secs := max(int(d/time.Second), 1)
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.HTTPAddr, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("profile: %s: %s", resp.Status, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
