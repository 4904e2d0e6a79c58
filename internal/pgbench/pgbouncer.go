package pgbench

import (
	"cmp"
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
	"strings"
	"syscall"
	"time"
)

// PgBouncer is a PgBouncer process in front of one PostgreSQL server, configured in a
// temporary directory.
type PgBouncer struct {
	Addr string // host:port it listens on
	dir  string
	cmd  *exec.Cmd
	exit *exitWatch // set once the process has started
}

// TLSFiles are a certificate and its key in PEM files.
type TLSFiles struct{ CertFile, KeyFile string }

// BouncerOptions say how PgBouncer pools and authenticates. The zero value is session
// mode with trust authentication and a pool large enough for every client.
type BouncerOptions struct {
	// SocketDir, when set, makes PgBouncer reach the server through its Unix socket in
	// that directory instead of TCP.
	SocketDir string
	// TLS, when set, makes PgBouncer require TLS from its clients, offering that
	// certificate, and talk TLS to the server.
	TLS *TLSFiles
	// PoolMode is pool_mode: "session" (the default) or "transaction".
	PoolMode string
	// PoolSize is default_pool_size and, in transaction mode, max_db_connections, so
	// that the server never sees more (default 100).
	PoolSize int
	// MaxClients is max_client_conn (default 200).
	MaxClients int
	// AuthType is auth_type (default "trust"); Secrets are the userlist.txt lines, user
	// to secret (the server URL's user with an empty secret by default).
	AuthType string
	Secrets  map[string]string
}

// bouncerINI renders pgbouncer.ini for a server at host:port (host may be a socket
// directory), PgBouncer listening on listenPort and keeping its files in dir.
func bouncerINI(o BouncerOptions, host, port string, listenPort int, dir string) string {
	mode := cmp.Or(o.PoolMode, "session")
	size := cmp.Or(o.PoolSize, 100)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = %s
auth_file = %s
pool_mode = %s
max_client_conn = %d
default_pool_size = %d
logfile = %s
pidfile = %s
ignore_startup_parameters = extra_float_digits,options
`, host, port, listenPort, cmp.Or(o.AuthType, "trust"), filepath.Join(dir, "userlist.txt"), mode,
		cmp.Or(o.MaxClients, 200), size, filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if mode == "transaction" {
		ini += fmt.Sprintf("max_db_connections = %d\n", size)
	}
	if o.TLS != nil {
		ini += fmt.Sprintf(`client_tls_sslmode = require
client_tls_cert_file = %s
client_tls_key_file = %s
server_tls_sslmode = require
`, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	}
	return ini
}

// Userlist renders userlist.txt: one "user" "secret" line per user, sorted, a double
// quote inside written twice.
func Userlist(secrets map[string]string) string {
	var b strings.Builder
	quote := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	for _, u := range slices.Sorted(maps.Keys(secrets)) {
		fmt.Fprintf(&b, "%s %s\n", quote(u), quote(secrets[u]))
	}
	return b.String()
}

// StartPgBouncer starts PgBouncer in front of the server of serverURL, listening on a
// free loopback port, as o says. When the process runs as root, PgBouncer (which refuses
// root) runs as the postgres user.
func StartPgBouncer(ctx context.Context, serverURL string, o BouncerOptions) (*PgBouncer, error) {
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
	if o.SocketDir != "" {
		host = o.SocketDir
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
	secrets := o.Secrets
	if secrets == nil {
		secrets = map[string]string{cmp.Or(u.User.Username(), "postgres"): ""}
	}
	files := map[string]string{
		"userlist.txt":  Userlist(secrets),
		"pgbouncer.ini": bouncerINI(o, host, port, listenPort, dir),
	}
	if o.TLS != nil {
		// Copies in its own directory, which PgBouncer's user owns.
		for name, src := range map[string]string{"tls.crt": o.TLS.CertFile, "tls.key": o.TLS.KeyFile} {
			pem, err := os.ReadFile(src)
			if err != nil {
				b.Close()
				return nil, err
			}
			files[name] = string(pem)
		}
	}
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

// UserCPU is a meter of the PgBouncer process's user CPU time.
func (b *PgBouncer) UserCPU() (time.Duration, error) { return ProcessUserCPU(b.cmd.Process.Pid)() }

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
