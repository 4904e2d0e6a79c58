package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/lib/pq" // registers database/sql driver "postgres"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// lookTool finds a client program on PATH or next to the PostgreSQL server binaries. It
// skips the test when the program is missing (fails it under CI).
func lookTool(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if bin := testenv.FindPostgresBin(); bin != "" {
		if p := filepath.Join(bin, name); fileExists(p) {
			return p
		}
	}
	testenv.SkipOrFail(t, "%s is not installed (run scripts/install-deps.sh)", name)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// runTool runs a client program and returns its stdout, failing the test with stderr.
func runTool(t testing.TB, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(name), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// parseIDs reads one ID per line.
func parseIDs(t testing.TB, out string) []int64 {
	t.Helper()
	var ids []int64
	for _, line := range strings.Fields(out) {
		id, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			t.Fatalf("client printed %q, not an ID", line)
		}
		ids = append(ids, id)
	}
	return ids
}

// clientRow is the GORM model of client_rows. Its ID is left zero on Create: the proxy
// fills it and GORM reads it back through RETURNING.
type clientRow struct {
	ID     int64 `gorm:"primaryKey"`
	Client string
}

func (clientRow) TableName() string { return "client_rows" }

// TestRealClients has each real client create rows without an ID through one proxy and
// read the ID back; the ID must be the one PostgreSQL stored, and no ID may repeat.
func TestRealClients(t *testing.T) {
	requireServeFlags(t, "snowflake-tags", "fill")
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	addTag(t, dsn, "bench", 100)
	execSQL(t, dsn, `CREATE TABLE client_rows (id bigint PRIMARY KEY, client text NOT NULL)`)
	execSQL(t, dsn, `CREATE TABLE bench_rows (id bigint PRIMARY KEY, note text NOT NULL)`)
	p := StartProxy(t, "clients", ProxyConfig{
		WorkerSource:  "static",
		WorkerID:      11,
		Upstream:      hostPort(t, dsn),
		Store:         dsn,
		SnowflakeTags: []string{snowOrder},
		Fill:          []string{"client_rows.id=" + snowOrder, "bench_rows.id=bench"},
	})
	requireRewriting(t, p, dsn, snowOrder)
	url := p.URL(dsn, "postgres", "")
	coll := NewCollector()

	// stored checks that every ID a client read back names a row it wrote.
	stored := func(t *testing.T, label string, ids []int64) {
		t.Helper()
		if len(ids) == 0 {
			t.Fatalf("%s read back no ID", label)
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		for _, id := range ids {
			var client string
			if err := conn.QueryRow(ctx, "SELECT client FROM client_rows WHERE id = $1", id).Scan(&client); err != nil {
				t.Errorf("%s: ID %d read back, but no such row in PostgreSQL: %v", label, id, err)
			} else if !strings.HasPrefix(client, label) {
				t.Errorf("%s: ID %d belongs to a row of %q", label, id, client)
			}
			coll.Add(IDRow{Namespace: snowflakeNamespace, ID: id, Origin: originClient, Proxy: label})
		}
	}

	t.Run("psql", func(t *testing.T) {
		psql := lookTool(t, "psql")
		out := runTool(t, "", nil, psql, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", url,
			"-c", "INSERT INTO client_rows (client) VALUES ('psql') RETURNING id",
			"-c", "INSERT INTO client_rows (client) VALUES ('psql 2'), ('psql 3') RETURNING id")
		ids := parseIDs(t, out)
		if len(ids) != 3 {
			t.Fatalf("psql printed %d IDs, want 3: %q", len(ids), out)
		}
		stored(t, "psql", ids)
	})

	t.Run("pgx", func(t *testing.T) {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var ids []int64
		var id int64
		if err := conn.QueryRow(ctx, "INSERT INTO client_rows (client) VALUES ($1) RETURNING id", "pgx").Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		// A pipelined batch: five executions of one prepared INSERT in one round trip.
		batch := &pgx.Batch{}
		for i := 0; i < 5; i++ {
			batch.Queue("INSERT INTO client_rows (client) VALUES ($1) RETURNING id", fmt.Sprintf("pgx batch %d", i))
		}
		br := conn.SendBatch(ctx, batch)
		for i := 0; i < 5; i++ {
			if err := br.QueryRow().Scan(&id); err != nil {
				t.Fatalf("batch row %d: %v", i, err)
			}
			ids = append(ids, id)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		stored(t, "pgx", ids)
	})

	t.Run("pgx cancel", func(t *testing.T) {
		// A CancelRequest reaches the right backend through the proxy, and the session
		// stays usable for the next filled INSERT.
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		cancelErr := make(chan error, 1)
		go func() {
			<-time.After(300 * time.Millisecond)
			cancelErr <- conn.PgConn().CancelRequest(ctx)
		}()
		began := time.Now()
		_, err = conn.Exec(ctx, "SELECT pg_sleep(30)")
		if err := <-cancelErr; err != nil {
			t.Fatalf("CancelRequest: %v", err)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("pg_sleep(30) cancelled after 300 ms: got %v after %v, want SQLSTATE 57014", err, time.Since(began))
		}
		t.Logf("cancelled after %v", time.Since(began).Round(time.Millisecond))
		var id int64
		if err := conn.QueryRow(ctx, "INSERT INTO client_rows (client) VALUES ('pgx after cancel') RETURNING id").Scan(&id); err != nil {
			t.Fatalf("after the cancel: %v", err)
		}
		stored(t, "pgx after cancel", []int64{id})
	})

	t.Run("database/sql+lib/pq", func(t *testing.T) {
		db, err := sql.Open("postgres", url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var ids []int64
		var id int64
		if err := db.QueryRow("INSERT INTO client_rows (client) VALUES ($1) RETURNING id", "lib/pq").Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		stmt, err := db.Prepare("INSERT INTO client_rows (client) VALUES ($1) RETURNING id")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		for i := 0; i < 3; i++ {
			if err := stmt.QueryRow(fmt.Sprintf("lib/pq prepared %d", i)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		stored(t, "lib/pq", ids)
	})

	t.Run("GORM", func(t *testing.T) {
		db, err := gorm.Open(gormpg.Open(url), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
		if err != nil {
			t.Fatal(err)
		}
		if sqlDB, err := db.DB(); err == nil {
			defer sqlDB.Close()
		}
		one := clientRow{Client: "gorm"}
		if err := db.Create(&one).Error; err != nil {
			t.Fatal(err)
		}
		if one.ID == 0 {
			t.Fatal("GORM Create left the model's ID zero: the proxy's ID did not come back")
		}
		many := []clientRow{{Client: "gorm batch 1"}, {Client: "gorm batch 2"}, {Client: "gorm batch 3"}}
		if err := db.Create(&many).Error; err != nil {
			t.Fatal(err)
		}
		ids := []int64{one.ID}
		for _, r := range many {
			ids = append(ids, r.ID)
		}
		var back clientRow
		if err := db.First(&back, one.ID).Error; err != nil || back.Client != "gorm" {
			t.Errorf("GORM First(%d) = %+v, %v", one.ID, back, err)
		}
		stored(t, "gorm", ids)
	})

	t.Run("node-postgres", func(t *testing.T) {
		node, npm := nodeTools(t)
		dir := nodeDir(t)
		if !fileExists(filepath.Join(dir, "node_modules", "pg")) {
			install := "install"
			if fileExists(filepath.Join(dir, "package-lock.json")) {
				install = "ci"
			}
			runTool(t, dir, nil, npm, install, "--no-audit", "--no-fund")
		}
		out := runTool(t, dir, []string{"DATABASE_URL=" + url, "TABLE=client_rows"}, node, "insert.js")
		ids := parseIDs(t, out)
		if len(ids) != 6 {
			t.Fatalf("node printed %d IDs, want 6: %q", len(ids), out)
		}
		// The last ID is a bare leaf_next('order'): it has no row.
		coll.Add(IDRow{Namespace: snowflakeNamespace, ID: ids[5], Origin: originLeafNext, Proxy: "node"})
		stored(t, "node", ids[:5])
	})

	t.Run("pgbench", func(t *testing.T) {
		pgbench := lookTool(t, "pgbench")
		dir := t.TempDir()
		const clients, perClient = 4, 150
		for _, mode := range []string{"simple", "extended", "prepared"} {
			script := filepath.Join(dir, mode+".sql")
			note := "pgbench " + mode
			if err := os.WriteFile(script, []byte(fmt.Sprintf("INSERT INTO bench_rows (note) VALUES ('%s');\n", note)), 0o644); err != nil {
				t.Fatal(err)
			}
			out := runTool(t, dir, nil, pgbench, "-n", "-M", mode, "-c", strconv.Itoa(clients), "-j", "2",
				"-t", strconv.Itoa(perClient), "-f", script, url)
			if m := regexp.MustCompile(`number of failed transactions: (\d+)`).FindStringSubmatch(out); m != nil && m[1] != "0" {
				t.Errorf("pgbench -M %s: %s failed transactions", mode, m[1])
			}
			tps := regexp.MustCompile(`tps = ([0-9.]+)`).FindStringSubmatch(out)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			var n, distinct int
			err = conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM bench_rows WHERE note = $1", note).Scan(&n, &distinct)
			conn.Close(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n != clients*perClient || distinct != n {
				t.Errorf("pgbench -M %s: %d rows with %d distinct IDs, want %d", mode, n, distinct, clients*perClient)
			}
			if tps != nil {
				t.Logf("FIGURE pgbench -M %s: %d filled INSERTs at %s TPS (4 clients, -race test binary beside it)", mode, n, tps[1])
			}
		}
	})

	requireNoDuplicates(t, coll)
}

// nodeTools finds node and npm: the test skips when they are absent (fails under CI).
func nodeTools(t testing.TB) (node, npm string) {
	t.Helper()
	var err1, err2 error
	node, err1 = exec.LookPath("node")
	npm, err2 = exec.LookPath("npm")
	if err1 != nil || err2 != nil {
		testenv.SkipOrFail(t, "node or npm is not installed (%v %v) for the node-postgres client", err1, err2)
	}
	return node, npm
}

// nodeDir is e2e/node, where the Node client and its package.json live.
func nodeDir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "node")
}
