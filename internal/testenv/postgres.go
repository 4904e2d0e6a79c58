package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a private PostgreSQL server in a temporary directory on a loopback port.
type Postgres struct {
	BinDir string // directory holding initdb, pg_ctl, postgres
	Dir    string // everything of this server: data, sockets, certificates, log
	Port   int
	CAFile string // CA certificate of the server's TLS certificate

	cred *syscall.Credential // whom the server runs as when we are root
}

// PostgresOptions tune a new server.
type PostgresOptions struct {
	BinDir         string // default: $LEAF_TEST_PG_BIN, then pg_config, then /usr/lib/postgresql/*/bin
	Port           int    // default: a free port
	MaxConnections int    // default: 1200
}

// FindPostgresBin returns the directory of PostgreSQL's server binaries, or "".
func FindPostgresBin() string {
	if d := os.Getenv(EnvPGBin); d != "" {
		return d
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p)
	}
	return ""
}

func versionOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// StartPostgres creates and starts a new server. Close stops it and removes its files.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	p := &Postgres{BinDir: opts.BinDir, Port: opts.Port}
	if p.BinDir == "" {
		p.BinDir = FindPostgresBin()
	}
	if p.BinDir == "" {
		return nil, fmt.Errorf("PostgreSQL server binaries not found (install the postgresql package or set %s)", EnvPGBin)
	}
	if p.Port == 0 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		p.Port = port
	}
	maxConns := opts.MaxConnections
	if maxConns == 0 {
		maxConns = 1200
	}
	dir, err := os.MkdirTemp("", "leafproxy-pg-")
	if err != nil {
		return nil, err
	}
	p.Dir = dir
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: run the server as the postgres user.
		cred, err := credentialOf("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		p.cred = cred
	}
	if err := p.initdb(maxConns); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.createRoles(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// NewPostgres starts a private server for one test and removes it when the test ends.
func NewPostgres(t testing.TB) *Postgres {
	t.Helper()
	if FindPostgresBin() == "" {
		need(t, EnvPGBin, "PostgreSQL server binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := StartPostgres(ctx, PostgresOptions{MaxConnections: 200})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
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

func (p *Postgres) dataDir() string { return filepath.Join(p.Dir, "data") }
func (p *Postgres) logFile() string { return filepath.Join(p.Dir, "postgres.log") }

func (p *Postgres) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(p.BinDir, name), args...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return cmd
}

func (p *Postgres) run(ctx context.Context, name string, args ...string) error {
	out, err := p.command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func (p *Postgres) chown(path string) error {
	if p.cred == nil {
		return nil
	}
	return os.Chown(path, int(p.cred.Uid), int(p.cred.Gid))
}

func (p *Postgres) initdb(maxConns int) error {
	if err := p.chown(p.Dir); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.run(ctx, "initdb", "-D", p.dataDir(), "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return err
	}
	certs, err := WriteCertificates(p.Dir, "server")
	if err != nil {
		return err
	}
	p.CAFile = certs.CAFile
	for _, f := range []string{certs.CertFile, certs.KeyFile, certs.CAFile} {
		if err := p.chown(f); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
max_connections = %d
shared_buffers = 64MB
dynamic_shared_memory_type = mmap
fsync = off
synchronous_commit = off
full_page_writes = off
ssl = on
ssl_cert_file = '%s'
ssl_key_file = '%s'
ssl_ca_file = '%s'
password_encryption = 'scram-sha-256'
log_min_messages = warning
`, p.Dir, maxConns, certs.CertFile, certs.KeyFile, certs.CAFile)
	f, err := os.OpenFile(filepath.Join(p.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	hba := fmt.Sprintf(`local all all trust
hostssl all %[1]s 127.0.0.1/32 scram-sha-256
host all %[1]s 127.0.0.1/32 reject
host all %[2]s 127.0.0.1/32 reject
host all %[3]s 127.0.0.1/32 md5
host all %[4]s 127.0.0.1/32 scram-sha-256
host all %[5]s 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
host all all ::1/128 trust
`, TLSUser, DeniedUser, MD5User, SCRAMUser, SASLprepUser)
	return os.WriteFile(filepath.Join(p.dataDir(), "pg_hba.conf"), []byte(hba), 0o600)
}

// Start starts the (stopped) server and waits until it accepts connections.
func (p *Postgres) Start(ctx context.Context) error {
	if err := p.run(ctx, "pg_ctl", "-D", p.dataDir(), "-l", p.logFile(), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d", p.Port), "start"); err != nil {
		log, _ := os.ReadFile(p.logFile())
		return fmt.Errorf("%w\nserver log:\n%s", err, log)
	}
	return waitFor(ctx, "PostgreSQL to accept connections", func() error {
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
}

// Stop shuts the server down cleanly (pg_ctl stop -m fast), dropping every connection.
func (p *Postgres) Stop(ctx context.Context) error {
	return p.run(ctx, "pg_ctl", "-D", p.dataDir(), "-m", "fast", "-w", "stop")
}

// Kill stops the server the hard way (pg_ctl stop -m immediate), as a crash would.
func (p *Postgres) Kill(ctx context.Context) error {
	return p.run(ctx, "pg_ctl", "-D", p.dataDir(), "-m", "immediate", "-w", "stop")
}

// Close stops the server if it runs and removes its directory.
func (p *Postgres) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := os.Stat(filepath.Join(p.dataDir(), "postmaster.pid")); err == nil {
		_ = p.Kill(ctx)
	}
	return os.RemoveAll(p.Dir)
}

// URL returns a connection URL for database "postgres" as user (no password).
func (p *Postgres) URL(user string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", user, p.Port)
}

// NewDatabase creates a fresh database on this server for the test and returns its URL.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, p.URL("postgres"))
}

func (p *Postgres) createRoles(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	stmts := []string{
		"SET password_encryption = 'md5'",
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", MD5User, MD5Password),
		"SET password_encryption = 'scram-sha-256'",
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", SCRAMUser, SCRAMPassword),
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", TLSUser, TLSPassword),
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", DeniedUser, DeniedPassword),
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", SASLprepUser, SASLprepPassword),
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}
