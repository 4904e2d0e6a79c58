package proxy

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	_ "github.com/lib/pq"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// needTool returns the path of a client program, skipping the test when it is missing
// (failing it under CI).
func needTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		testenv.SkipOrFail(t, "%s not installed: %v", name, err)
	}
	return path
}

// runTool runs a client program and returns its combined output.
func runTool(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(needTool(t, name), args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGOPTIONS=", "PSQLRC=/dev/null")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestPsql(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	url := p.url(db)
	dir := t.TempDir()

	script := `
CREATE TABLE items (id int PRIMARY KEY, name text);
INSERT INTO items VALUES (1, 'one'), (2, 'two');
BEGIN;
INSERT INTO items VALUES (3, 'three');
SELECT 1/0;
SELECT 'unreachable';
ROLLBACK;
SELECT count(*) AS n FROM items;
\copy items FROM '` + filepath.Join(dir, "in.tsv") + `'
\copy (SELECT id, name FROM items ORDER BY id) TO '` + filepath.Join(dir, "out.tsv") + `'
LISTEN leaf_channel;
NOTIFY leaf_channel, 'payload';
SELECT 'done';
`
	if err := os.WriteFile(filepath.Join(dir, "in.tsv"), []byte("10\tten\n11\televen\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "script.sql"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runTool(t, "psql", "-X", "-v", "ON_ERROR_STOP=0", "-At", "-d", url, "-f", filepath.Join(dir, "script.sql"))
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	for _, want := range []string{
		"division by zero",
		"current transaction is aborted",
		"\n2\n", // the rolled-back row is gone
		`Asynchronous notification "leaf_channel" with payload "payload" received`,
		"done",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("psql output lacks %q:\n%s", want, out)
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "out.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "1\tone\n2\ttwo\n10\tten\n11\televen\n"; string(got) != want {
		t.Fatalf("\\copy out wrote %q, want %q", got, want)
	}

	// A multi-statement simple query in one message.
	out, err = runTool(t, "psql", "-X", "-At", "-d", url, "-c", "SELECT 1; SELECT 2; SELECT 3")
	if err != nil || out != "1\n2\n3\n" {
		t.Fatalf("multi-statement query: %v\n%q", err, out)
	}
}

func TestLibPQ(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	conn, err := sql.Open("postgres", p.url(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetMaxOpenConns(4)
	if _, err := conn.Exec("CREATE TABLE pq_items (id serial PRIMARY KEY, name text)"); err != nil {
		t.Fatal(err)
	}
	stmt, err := conn.Prepare("INSERT INTO pq_items (name) VALUES ($1) RETURNING id")
	if err != nil {
		t.Fatal(err)
	}
	defer stmt.Close()
	for i := range 50 {
		var id int
		if err := stmt.QueryRow(fmt.Sprintf("item %d", i)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id != i+1 {
			t.Fatalf("id %d, want %d", id, i+1)
		}
	}
	tx, err := conn.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("DELETE FROM pq_items WHERE id > $1", 10); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow("SELECT count(*) FROM pq_items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 50 {
		t.Fatalf("count %d after rollback, want 50", n)
	}
}

var pgbenchFailures = regexp.MustCompile(`number of failed transactions: (\d+)`)
var pgbenchProcessed = regexp.MustCompile(`number of transactions actually processed: (\d+)`)

func TestPgbench(t *testing.T) {
	db := testenv.NewDatabase(t)
	p := startProxy(t, db)
	url := p.url(db)
	if out, err := runTool(t, "pgbench", "-i", "-s", "1", "-q", url); err != nil {
		t.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	for _, mode := range []string{"simple", "extended", "prepared"} {
		t.Run(mode, func(t *testing.T) {
			out, err := runTool(t, "pgbench", "-n", "-M", mode, "-c", "4", "-j", "2", "-t", "200", url)
			if err != nil {
				t.Fatalf("pgbench: %v\n%s", err, out)
			}
			if m := pgbenchFailures.FindStringSubmatch(out); m != nil && m[1] != "0" {
				t.Fatalf("%s failed transactions:\n%s", m[1], out)
			}
			m := pgbenchProcessed.FindStringSubmatch(out)
			if m == nil || m[1] != "800" {
				t.Fatalf("pgbench did not process 800 transactions:\n%s", out)
			}
		})
	}
}
