package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

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

// summarizeValues is summarize with the values of a DataRow (hex in binary).
func summarizeValues(msg pgproto3.BackendMessage) string {
	if m, ok := msg.(*pgproto3.DataRow); ok {
		var vs []string
		for _, v := range m.Values {
			if utf8.Valid(v) && !bytes.ContainsAny(v, "\x00") {
				vs = append(vs, string(v))
			} else {
				vs = append(vs, hex.EncodeToString(v))
			}
		}
		return "data(" + strings.Join(vs, ",") + ")"
	}
	return summarize(msg)
}

// TestDecodeLikeServer decodes IDs at rest, where the proxy answers itself, and where
// PostgreSQL answers the rewritten statement (inside a transaction block for the extended
// protocol, behind a query in flight for a simple one), in several time zones and date
// styles and in both formats: the messages must be the same, byte for byte.
func TestDecodeLikeServer(t *testing.T) {
	db := testenv.NewDatabase(t)
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, db, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} })
	id := int64(1724551110974709248) // 2023-11-14 22:13:20.123 UTC, worker 625, sequence 3584
	lit := &pgproto3.Parse{Query: "SELECT leaf_decode(" + itoa(int(id)) + ")"}
	param := &pgproto3.Parse{Query: "SELECT leaf_decode($1)"}
	int8Param := binary.BigEndian.AppendUint64(nil, uint64(id))
	sync := &pgproto3.Sync{}
	cycles := map[string][]pgproto3.FrontendMessage{
		"literal":       {lit, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		"binary result": {lit, &pgproto3.Bind{ResultFormatCodes: []int16{1}}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		"text parameter": {param, &pgproto3.Describe{ObjectType: 'S'},
			&pgproto3.Bind{Parameters: [][]byte{[]byte(itoa(int(id)))}}, &pgproto3.Execute{MaxRows: 1}, &pgproto3.Execute{}, sync},
		"binary int8 parameter": {&pgproto3.Parse{Query: "SELECT leaf_decode($1)", ParameterOIDs: []uint32{oidInt8}},
			&pgproto3.Bind{ParameterFormatCodes: []int16{1}, Parameters: [][]byte{int8Param}}, &pgproto3.Execute{}, sync},
		"parameter the server must read": {param, &pgproto3.Bind{Parameters: [][]byte{[]byte(" 42 ")}}, &pgproto3.Execute{}, sync},
		"negative parameter":             {param, &pgproto3.Bind{Parameters: [][]byte{[]byte("-1")}}, &pgproto3.Execute{}, sync},
		"per-column result formats":      {lit, &pgproto3.Bind{ResultFormatCodes: []int16{0, 1, 0}}, &pgproto3.Execute{}, sync},
	}
	for _, setting := range []string{"TimeZone = 'UTC'", "TimeZone = 'Asia/Kolkata'", "TimeZone = 'America/New_York'",
		"TimeZone = 'Europe/Paris'", "DateStyle = 'ISO, DMY'", "DateStyle = 'SQL, DMY'", "TimeZone = 'Asia/Kathmandu'"} {
		for name, msgs := range cycles {
			t.Run(setting+"/"+name, func(t *testing.T) {
				fe := rawConn(t, p.url(db))
				exchange(t, fe, &pgproto3.Query{String: "SET " + setting})
				local := exchangeWith(t, fe, summarizeValues, msgs...)
				simpleLocal := exchangeWith(t, fe, summarizeValues, &pgproto3.Query{String: lit.Query})
				exchange(t, fe, &pgproto3.Query{String: "BEGIN"})
				upstream := exchangeWith(t, fe, summarizeValues, msgs...)
				exchange(t, fe, &pgproto3.Query{String: "ROLLBACK"})
				simpleUpstream := exchangeWith(t, fe, summarizeValues, &pgproto3.Query{String: "SELECT pg_sleep(0)"}, &pgproto3.Query{String: lit.Query})[4:]
				if strings.Join(local, " ") != strings.Join(upstream, " ") {
					t.Fatalf("at rest:\n%s\ninside a transaction (the server's answers):\n%s", strings.Join(local, " "), strings.Join(upstream, " "))
				}
				if strings.Join(simpleLocal, " ") != strings.Join(simpleUpstream, " ") {
					t.Fatalf("simple query at rest:\n%s\nbehind another (the server's answers):\n%s", strings.Join(simpleLocal, " "), strings.Join(simpleUpstream, " "))
				}
			})
		}
	}
}

// TestDecodeIsLocal decodes against an upstream that answers a Sync or a Query with
// nothing but ReadyForQuery: only the proxy can have sent the row. The binary timestamp is
// microseconds since 2000-01-01 UTC.
func TestDecodeIsLocal(t *testing.T) {
	up := startFakeUpstream(t, false)
	url := "postgres://postgres@" + up.addr() + "/postgres"
	rw, err := rewrite.New(rewrite.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, url, func(s *Server) { s.Rewriter, s.IDs = rw, &stubIDs{} })
	fe := rawConn(t, p.url(url))
	got := exchangeWith(t, fe, summarizeValues,
		&pgproto3.Query{String: "SELECT leaf_decode(1724551110974709248)"},
		&pgproto3.Parse{Query: "SELECT leaf_decode($1)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("1724551110974709248")}, ResultFormatCodes: []int16{1}},
		&pgproto3.Execute{}, &pgproto3.Sync{},
	)
	want := "row(timestamp/0/0/1184/8/-1/0,worker/0/0/20/8/-1/0,sequence/0/0/20/8/-1/0) data(2023-11-14 22:13:20.123+00,625,3584) complete:SELECT 1 ready " +
		"parse bind data(0002ad22dce84078,0000000000000271,0000000000000e00) complete:SELECT 1 ready"
	if strings.Join(got, " ") != want {
		t.Fatalf("responses\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}
