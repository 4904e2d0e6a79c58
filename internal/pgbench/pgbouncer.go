package pgbench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// PgBouncer is a PgBouncer process in session mode in front of one PostgreSQL server,
// configured in a temporary directory, with trust authentication.
type PgBouncer struct {
	Addr string // host:port it listens on
	dir  string
	cmd  *exec.Cmd
	exit *exitWatch // set once the process has started
}

// TLSFiles are a certificate and its key in PEM files.
type TLSFiles struct{ CertFile, KeyFile string }

// StartPgBouncer starts PgBouncer (session mode) in front of the server of serverURL,
// listening on a free loopback port. When the process runs as root, PgBouncer (which
// refuses root) runs as the postgres user. A non-empty socketDir makes PgBouncer reach
// the server through its Unix socket in that directory instead of TCP. With tlsFiles,
// PgBouncer requires TLS from its clients, offering that certificate, and talks TLS to
// the server.
func StartPgBouncer(ctx context.Context, serverURL, socketDir string, tlsFiles *TLSFiles) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer not installed: %w", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("server address %q: %w", u.Host, err)
	}
	if socketDir != "" {
		host = socketDir
	}
	listenPort, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leafproxy-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(listenPort)), dir: dir}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = session
max_client_conn = 200
default_pool_size = 100
logfile = %s
pidfile = %s
ignore_startup_parameters = extra_float_digits,options
`, host, port, listenPort, filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	user := u.User.Username()
	if user == "" {
		user = "postgres"
	}
	files := map[string]string{
		"userlist.txt": fmt.Sprintf("%q \"\"\n", user),
	}
	if tlsFiles != nil {
		// Copies in its own directory, which PgBouncer's user owns.
		for name, src := range map[string]string{"tls.crt": tlsFiles.CertFile, "tls.key": tlsFiles.KeyFile} {
			pem, err := os.ReadFile(src)
			if err != nil {
				b.Close()
				return nil, err
			}
			files[name] = string(pem)
		}
		ini += fmt.Sprintf(`client_tls_sslmode = require
client_tls_cert_file = %s
client_tls_key_file = %s
server_tls_sslmode = require
`, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	}
	files["pgbouncer.ini"] = ini
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			b.Close()
			return nil, err
		}
	}
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 {
		cred, err := credentialOf("postgres")
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("pgbouncer refuses root and there is no postgres user: %w", err)
		}
		for _, name := range append([]string{""}, slices.Collect(maps.Keys(files))...) {
			if err := os.Chown(filepath.Join(dir, name), int(cred.Uid), int(cred.Gid)); err != nil {
				b.Close()
				return nil, err
			}
		}
		b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := b.cmd.Start(); err != nil {
		b.Close()
		return nil, err
	}
	b.exit = watchExit(b.cmd)
	if err := waitListening(ctx, b.Addr, b.exit); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
		b.Close()
		return nil, fmt.Errorf("pgbouncer did not start: %w\n%s", err, log)
	}
	return b, nil
}

// CPU is a CPU meter of the PgBouncer process.
func (b *PgBouncer) CPU() (time.Duration, error) { return ProcessCPU(b.cmd.Process.Pid)() }

// URL returns serverURL pointed at PgBouncer.
func (b *PgBouncer) URL(serverURL string) string { return withHost(serverURL, b.Addr) }

// Close stops PgBouncer and removes its directory.
func (b *PgBouncer) Close() error {
	if b.exit != nil {
		b.exit.stop(syscall.SIGINT, 5*time.Second)
	}
	return os.RemoveAll(b.dir)
}

func credentialOf(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitListening waits until addr accepts TCP connections or the process exits.
func waitListening(ctx context.Context, addr string, exit *exitWatch) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		select {
		case <-exit.done:
			return errors.Join(errors.New("process exited"), exit.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// withHost returns rawURL with its host:port replaced.
func withHost(rawURL, hostport string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.Host = hostport
	return u.String()
}
