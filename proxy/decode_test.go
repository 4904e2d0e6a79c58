package proxy

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/rewrite"
)

// TestDecodePgx decodes snowflake IDs with pgx in every query mode, with the ID as a
// literal and as a parameter, and refuses bad IDs with 22023, the session staying usable.
func TestDecodePgx(t *testing.T) {
	db := testenv.NewDatabase(t)
	layout := rewrite.SnowflakeLayout{EpochMillis: 1600000000000, WorkerBits: 8, SequenceBits: 14}
	rw, err := rewrite.New(rewrite.Settings{Snowflake: layout})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} })
	millis := int64(1700000000123)
	id := (millis-layout.EpochMillis)<<22 | 201<<14 | 9999
	for _, mode := range allModes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			conn := connectMode(t, p.url(db), mode)
			check := func(sql string, args ...any) {
				t.Helper()
				rows, err := conn.Query(ctx, sql, args...)
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, f := range rows.FieldDescriptions() {
					names = append(names, f.Name)
				}
				type decoded struct {
					Timestamp time.Time
					Worker    int64
					Sequence  int64
				}
				got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[decoded])
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(names, ",") != "timestamp,worker,sequence" || len(got) != 1 ||
					got[0].Timestamp.UnixMilli() != millis || got[0].Worker != 201 || got[0].Sequence != 9999 {
					t.Fatalf("%s: columns %v, rows %+v", sql, names, got)
				}
			}
			check("SELECT leaf_decode(" + itoa(int(id)) + ")")
			if mode != pgx.QueryExecModeSimpleProtocol {
				check("SELECT leaf_decode($1)", id)
			}
			_, err := conn.Exec(ctx, "SELECT leaf_decode(-1)")
			wantSQLState(t, err, "22023")
			if mode != pgx.QueryExecModeSimpleProtocol {
				_, err = conn.Exec(ctx, "SELECT leaf_decode($1)", -1)
				wantSQLState(t, err, "22023")
				_, err = conn.Exec(ctx, "SELECT leaf_decode($1)", nil)
				wantSQLState(t, err, "22023")
			}
			_, err = conn.Exec(ctx, "SELECT leaf_decode(1), 2")
			wantSQLState(t, err, "0A000")
			check("SELECT leaf_decode(" + itoa(int(id)) + ")")
		})
	}
}

// TestDecodePsql decodes an ID with psql: the timestamp follows the session's TimeZone.
func TestDecodePsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("psql not found")
		}
		t.Skip("psql not found")
	}
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} })
	// Leaf's layout: 2023-11-14 22:13:20.123 UTC, worker 5, sequence 7.
	id := (int64(1700000000123)-1288834974657)<<22 | 5<<12 | 7
	cmd := exec.Command(psql, "-X", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1", "-d", p.url(db))
	cmd.Stdin = strings.NewReader("SET TimeZone = 'UTC';\nSELECT leaf_decode(" + itoa(int(id)) + ");\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(strings.TrimPrefix(string(out), "SET\n")); got != "2023-11-14 22:13:20.123+00|5|7" {
		t.Fatalf("psql printed %q", out)
	}
}
