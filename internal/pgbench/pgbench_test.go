package pgbench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	out := `transaction type: <builtin: select only>
number of transactions actually processed: 51234
number of failed transactions: 3 (0.006%)
latency average = 0.156 ms
initial connection time = 4.502 ms
tps = 5123.456789 (without initial connection time)
`
	r, err := parse(out, "proxy", "simple", 8)
	if err != nil {
		t.Fatal(err)
	}
	if r.TPS != 5123.456789 || r.Failed != 3 || r.Transactions != 51234 || r.Endpoint != "proxy" || r.Clients != 8 {
		t.Fatalf("parsed %+v", r)
	}
	// pgbench -C reports its TPS with the connections counted in.
	reconnect := "number of transactions actually processed: 860\nlatency average = 5.812 ms\naverage connection time = 4.901 ms\ntps = 171.953212 (including reconnection times)\n"
	if r, err := parse(reconnect, "proxy", "simple", 1); err != nil || r.TPS != 171.953212 || r.Transactions != 860 {
		t.Fatalf("pgbench -C output parsed as %+v, %v", r, err)
	}
	if _, err := parse("pgbench: error: connection refused", "proxy", "simple", 1); err == nil {
		t.Fatal("no error for output without tps")
	}
}

func TestMedianAndTable(t *testing.T) {
	m := median([]Result{{TPS: 30, Failed: 1}, {TPS: 10}, {TPS: 20, Failed: 2}})
	if m.TPS != 20 || m.Failed != 3 {
		t.Fatalf("median %+v", m)
	}
	meter := func() (time.Duration, error) { return 0, nil }
	groups := []Group{{Name: "select-only", Endpoints: []Endpoint{{Name: "direct"}, {Name: "proxy", CPU: meter}}}}
	results := []Result{
		{Group: "select-only", Endpoint: "direct", Mode: "simple", Clients: 8, TPS: 1000},
		{Group: "select-only", Endpoint: "proxy", Mode: "simple", Clients: 8, TPS: 900, Transactions: 4000, HopCPU: 50 * time.Millisecond},
	}
	table := Table(groups, results)
	for _, want := range []string{
		"| select-only | mode | clients | direct TPS | proxy TPS | proxy / direct | proxy CPU µs/tx |",
		"|---|---|---:|---:|---:|---:|---:|",
		"| | simple | 8 | 1000 | 900 | 0.90× | 12.5 |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// A command name with a space and a parenthesis, as the kernel prints it.
	stat := "4242 (pg bouncer) S 1 4242 4242 0 -1 4194560 283 0 0 0 150 25 30 7 20 0 1 0 1234 12345678 1000 18446744073709551615"
	got, err := parseStatCPU(stat, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1750 * time.Millisecond; got != want {
		t.Fatalf("cpu %v, want %v", got, want)
	}
	// With the children that have ended: cutime 30 and cstime 7 more ticks.
	if got, err := parseStatCPU(stat, true); err != nil || got != 2120*time.Millisecond {
		t.Fatalf("cpu with children %v, %v, want 2.12s", got, err)
	}
	if _, err := parseStatCPU("garbage", false); err == nil {
		t.Fatal("no error for a line without a command name")
	}
	// User time alone: utime's 150 ticks.
	if got, err := parseStatUserCPU(stat); err != nil || got != 1500*time.Millisecond {
		t.Fatalf("user cpu %v, %v, want 1.5s", got, err)
	}
	if _, err := parseStatUserCPU("garbage"); err == nil {
		t.Fatal("no error for a line without a command name")
	}
}

func TestParseMachineCPU(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 5 40 9000 70 3 2 10 50 0\ncpu0 50 2 20 4500 35 1 1 5 25 0\nintr 1\n"
	got, err := parseMachineCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1600 * time.Millisecond; got != want { // 100+5+40+3+2+10 ticks
		t.Fatalf("machine cpu %v, want %v", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8", "cpu 1 2 3"} {
		if _, err := parseMachineCPU(bad); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	if _, err := MachineCPU(); err != nil {
		t.Fatalf("MachineCPU: %v", err)
	}
}

func TestCPUNote(t *testing.T) {
	r := Result{Transactions: 1000, HopCPU: 30 * time.Millisecond, MachineCPU: 150 * time.Millisecond}
	if got, want := cpuNote(r), ", 30.0 µs CPU/tx in the hop, 150 µs CPU/tx in the machine"; got != want {
		t.Errorf("cpuNote = %q, want %q", got, want)
	}
	r.HopCPU = 0 // direct: no hop
	if got, want := cpuNote(r), ", 150 µs CPU/tx in the machine"; got != want {
		t.Errorf("cpuNote without a hop = %q, want %q", got, want)
	}
}

func TestSelfCPUGrows(t *testing.T) {
	before, err := SelfCPU()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		after, err := SelfCPU()
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("self CPU did not grow past %v while spinning", before)
		}
	}
}

// fakePgbench writes a stand-in for the pgbench binary that prints a run's summary, or
// fails when its last argument (the URL) is "fail".
func fakePgbench(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pgbench")
	script := `#!/bin/sh
for last; do :; done
if [ "$last" = fail ]; then echo "connection refused" >&2; exit 1; fi
echo "number of transactions actually processed: 1000"
echo "tps = 200.0 (without initial connection time)"
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestRunPrepareAndRestore(t *testing.T) {
	var calls []string
	prepare := func(context.Context) (func() error, error) {
		calls = append(calls, "prepare")
		return func() error { calls = append(calls, "restore"); return nil }, nil
	}
	meter := func() (time.Duration, error) {
		calls = append(calls, "meter")
		return time.Duration(len(calls)) * time.Millisecond, nil
	}
	cfg := Config{Pgbench: fakePgbench(t), Duration: time.Second, Clients: []int{1}, Modes: []string{"simple"}}
	groups := []Group{{Name: "g", Prepare: prepare, Endpoints: []Endpoint{{Name: "a", URL: "ok"}, {Name: "b", URL: "ok", CPU: meter}}}}
	results, err := Run(context.Background(), cfg, groups)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(calls, ","); got != "prepare,meter,meter,restore" {
		t.Fatalf("calls %s", got)
	}
	if len(results) != 2 || results[1].Transactions != 1000 || results[1].HopCPU != time.Millisecond {
		t.Fatalf("results %+v", results)
	}

	// A failing run still restores.
	calls = nil
	groups[0].Endpoints[1].URL = "fail"
	if _, err := Run(context.Background(), cfg, groups); err == nil {
		t.Fatal("no error for a failing run")
	}
	if calls[0] != "prepare" || calls[len(calls)-1] != "restore" {
		t.Fatalf("calls %v", calls)
	}
}

func TestTableBaselineCPU(t *testing.T) {
	meter := func() (time.Duration, error) { return 0, nil }
	groups := []Group{{Name: "connect", Endpoints: []Endpoint{{Name: "direct", CPU: meter}, {Name: "proxy", CPU: meter}}}}
	results := []Result{
		{Group: "connect", Endpoint: "direct", Mode: "simple", Clients: 1, TPS: 100, Transactions: 500, HopCPU: 3 * time.Second},
		{Group: "connect", Endpoint: "proxy", Mode: "simple", Clients: 1, TPS: 90, Transactions: 450, HopCPU: 450 * time.Millisecond},
	}
	table := Table(groups, results)
	for _, want := range []string{
		"| connect | mode | clients | direct TPS | direct CPU µs/tx | proxy TPS | proxy / direct | proxy CPU µs/tx |",
		"| | simple | 1 | 100 | 6000.0 | 90 | 0.90× | 1000.0 |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestStartLeafproxyExited: a binary that exits at once is reported as not started, and
// promptly: the start-up check and the clean-up both wait for the same exit.
func TestStartLeafproxyExited(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "leafproxy")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho cannot start >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		p, err := StartLeafproxy(ctx, bin)
		if err == nil {
			p.Close()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "process exited") || !strings.Contains(err.Error(), "cannot start") {
			t.Fatalf("StartLeafproxy of a binary that exits: %v, want a start-up error quoting its log", err)
		}
	case <-time.After(50 * time.Second):
		t.Fatal("StartLeafproxy of a binary that exits did not return within 50 s")
	}
}

// TestMedianCPUOfRounds: a row's CPU per transaction is the median of its rounds' own
// figures, not that of the round with the median TPS, and the table gives the range.
func TestMedianCPUOfRounds(t *testing.T) {
	rs := []Result{
		{TPS: 100, Transactions: 1000, HopCPU: 30 * time.Millisecond}, // 30 µs/tx
		{TPS: 300, Transactions: 1000, HopCPU: 10 * time.Millisecond}, // 10 µs/tx
		{TPS: 200, Transactions: 1000, HopCPU: 12 * time.Millisecond}, // 12 µs/tx, median TPS
		{TPS: 150, Transactions: 1000, HopCPU: 20 * time.Millisecond}, // 20 µs/tx
		{TPS: 250, Transactions: 1000, HopCPU: 11 * time.Millisecond}, // 11 µs/tx
	}
	m := median(rs)
	if m.TPS != 200 {
		t.Fatalf("median TPS %v, want 200", m.TPS)
	}
	if got := m.CPUPerTx(); got != 12*time.Microsecond {
		t.Errorf("median CPU per tx %v, want 12µs", got)
	}
	rs[2].HopCPU = 25 * time.Millisecond // the median-TPS round is now a slow one
	if got := median(rs).CPUPerTx(); got != 20*time.Microsecond {
		t.Errorf("median CPU per tx %v, want 20µs (the rounds' median, not the median-TPS round's 25µs)", got)
	}
	meter := func() (time.Duration, error) { return 0, nil }
	groups := []Group{{Name: "g", Endpoints: []Endpoint{{Name: "direct"}, {Name: "proxy", CPU: meter}}}}
	row := median(rs)
	row.Group, row.Endpoint, row.Mode, row.Clients = "g", "proxy", "simple", 8
	table := Table(groups, []Result{{Group: "g", Endpoint: "direct", Mode: "simple", Clients: 8, TPS: 400}, row})
	if want := "| | simple | 8 | 400 | 200 | 0.50× | 20.0 (10.0–30.0) |"; !strings.Contains(table, want) {
		t.Errorf("table lacks %q:\n%s", want, table)
	}
}

// TestRoundsRotateEndpoints: each round starts with the next endpoint, so that no
// endpoint always follows the same one.
func TestRoundsRotateEndpoints(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "order")
	bin := filepath.Join(dir, "pgbench")
	script := `#!/bin/sh
for last; do :; done
echo "$last" >> ` + log + `
echo "number of transactions actually processed: 1000"
echo "tps = 200.0 (without initial connection time)"
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Pgbench: bin, Duration: time.Second, Clients: []int{1}, Modes: []string{"simple"}, Rounds: 3}
	groups := []Group{{Name: "g", Endpoints: []Endpoint{{Name: "a", URL: "a"}, {Name: "b", URL: "b"}, {Name: "c", URL: "c"}}}}
	results, err := Run(context.Background(), cfg, groups)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(b)), []string{"a", "b", "c", "b", "c", "a", "c", "a", "b"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("runs in order %v, want %v", got, want)
	}
	if len(results) != 3 || results[0].Endpoint != "a" || results[1].Endpoint != "b" || results[2].Endpoint != "c" {
		t.Errorf("results not in endpoint order: %+v", results)
	}
}

// TestBouncerINITransactionMode: a transaction pool caps the server connections at the
// pool size (max_db_connections as well as default_pool_size) and takes the clients and
// authentication asked for; session mode keeps its defaults and sets no cap.
func TestBouncerINITransactionMode(t *testing.T) {
	ini := bouncerINI(BouncerOptions{PoolMode: "transaction", PoolSize: 20, MaxClients: 300, AuthType: "md5"},
		"127.0.0.1", "5432", 6432, "/d")
	for _, want := range []string{
		"* = host=127.0.0.1 port=5432\n",
		"listen_port = 6432\n",
		"pool_mode = transaction\n",
		"default_pool_size = 20\n",
		"max_db_connections = 20\n",
		"max_client_conn = 300\n",
		"auth_type = md5\n",
		"auth_file = /d/userlist.txt\n",
	} {
		if !strings.Contains(ini, want) {
			t.Errorf("transaction-mode ini lacks %q:\n%s", want, ini)
		}
	}
	if strings.Contains(ini, "tls") {
		t.Errorf("ini without TLS files mentions TLS:\n%s", ini)
	}
	session := bouncerINI(BouncerOptions{SocketDir: "/run/pg", TLS: &TLSFiles{}}, "/run/pg", "5432", 6432, "/d")
	for _, want := range []string{"* = host=/run/pg port=5432\n", "pool_mode = session\n", "default_pool_size = 100\n",
		"max_client_conn = 200\n", "auth_type = trust\n", "client_tls_sslmode = require\n", "server_tls_sslmode = require\n"} {
		if !strings.Contains(session, want) {
			t.Errorf("session-mode ini lacks %q:\n%s", want, session)
		}
	}
	if strings.Contains(session, "max_db_connections") {
		t.Errorf("session-mode ini caps the server connections:\n%s", session)
	}
}

func TestUserlist(t *testing.T) {
	got := Userlist(map[string]string{"bob": "md5abc", `we"ird`: "", "alice": `pa"ss`})
	want := "\"alice\" \"pa\"\"ss\"\n\"bob\" \"md5abc\"\n\"we\"\"ird\" \"\"\n"
	if got != want {
		t.Fatalf("userlist\n%s\nwant\n%s", got, want)
	}
}

// TestUnsupportedMode: an endpoint that cannot run a mode is not run in it (a pgbench
// that fails for it would fail the whole comparison), and its cells say why.
func TestUnsupportedMode(t *testing.T) {
	meter := func() (time.Duration, error) { return 0, nil }
	cfg := Config{Pgbench: fakePgbench(t), Duration: time.Second, Clients: []int{200}, Modes: []string{"simple", "prepared"}}
	groups := []Group{{Name: "tx-pool", Endpoints: []Endpoint{
		{Name: "direct", URL: "ok"},
		{Name: "bouncer", URL: "ok", CPU: meter, Unsupported: map[string]string{"prepared": "cannot"}},
	}}}
	groups[0].Endpoints[1].URL = "fail" // would fail if run
	groups[0].Endpoints[1].Unsupported["simple"] = "cannot"
	results, err := Run(context.Background(), cfg, groups)
	if err != nil {
		t.Fatalf("run of an endpoint in a mode it cannot run: %v", err)
	}
	if len(results) != 2 || results[0].Endpoint != "direct" || results[1].Endpoint != "direct" {
		t.Fatalf("results %+v, want the direct runs alone", results)
	}
	groups[0].Endpoints[1].URL = "ok"
	delete(groups[0].Endpoints[1].Unsupported, "simple")
	if results, err = Run(context.Background(), cfg, groups); err != nil || len(results) != 3 {
		t.Fatalf("results %+v, %v, want three", results, err)
	}
	table := Table(groups, results)
	for _, want := range []string{
		"| | simple | 200 | 200 | 200 | 1.00× | 0.0 |",
		"| | prepared | 200 | 200 | cannot | – | – |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestDuringRunsAlongEachRun: an endpoint's During runs once per run of that endpoint,
// named after the run and given its length (the group's, which replaces the Config's),
// the run waits for it, and its error fails the run.
func TestDuringRunsAlongEachRun(t *testing.T) {
	var runs []string
	done := 0
	during := func(ctx context.Context, run string, d time.Duration) error {
		runs = append(runs, run)
		if d != 3*time.Second {
			t.Errorf("During got %v, want the group's 3s", d)
		}
		time.Sleep(10 * time.Millisecond) // a run must wait for a slow During
		done++
		return nil
	}
	cfg := Config{Pgbench: fakePgbench(t), Duration: time.Second, Clients: []int{200}, Modes: []string{"simple"}, Rounds: 2}
	groups := []Group{{Name: "tx-pool", Duration: 3 * time.Second,
		Endpoints: []Endpoint{{Name: "direct", URL: "ok"}, {Name: "proxy", URL: "ok", During: during}}}}
	if _, err := Run(context.Background(), cfg, groups); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(runs, ","), "tx-pool-simple-200c-r1,tx-pool-simple-200c-r2"; got != want || done != 2 {
		t.Fatalf("During ran for %s (%d finished), want %s", got, done, want)
	}
	groups[0].Endpoints[1].During = func(context.Context, string, time.Duration) error { return errors.New("no profile") }
	if _, err := Run(context.Background(), cfg, groups); err == nil || !strings.Contains(err.Error(), "no profile") {
		t.Fatalf("Run with a failing During: %v", err)
	}
}

// TestPairedCPU: a hop with a rival gets a column comparing their CPU per transaction
// round by round: the median of the rounds' ratios, their range, and in how many rounds
// the hop cost less; a mode the rival cannot run has none.
func TestPairedCPU(t *testing.T) {
	meter := func() (time.Duration, error) { return 0, nil }
	groups := []Group{{Name: "g", Endpoints: []Endpoint{
		{Name: "direct"}, {Name: "proxy", CPU: meter, Rival: "bouncer"}, {Name: "bouncer", CPU: meter, Unsupported: map[string]string{"prepared": "cannot"}},
	}}}
	rounds := func(endpoint, mode string, tps float64, usPerTx ...int) Result {
		var rs []Result
		for _, us := range usPerTx {
			rs = append(rs, Result{TPS: tps, Transactions: 1000, HopCPU: time.Duration(us) * time.Millisecond})
		}
		m := median(rs)
		m.Group, m.Endpoint, m.Mode, m.Clients = "g", endpoint, mode, 8
		return m
	}
	// Round by round: 30/40, 36/30, 20/25: ratios 0.75, 1.2, 0.8. The medians (30 and
	// 30) alone would call the two equal.
	results := []Result{
		{Group: "g", Endpoint: "direct", Mode: "simple", Clients: 8, TPS: 400},
		rounds("proxy", "simple", 200, 30, 36, 20),
		rounds("bouncer", "simple", 200, 40, 30, 25),
		{Group: "g", Endpoint: "direct", Mode: "prepared", Clients: 8, TPS: 400},
		rounds("proxy", "prepared", 200, 30, 36, 20),
	}
	table := Table(groups, results)
	for _, want := range []string{
		"| proxy CPU µs/tx | bouncer TPS | bouncer / direct | bouncer CPU µs/tx | proxy / bouncer CPU per round |",
		"| 30.0 (25.0–40.0) | 0.80× (0.75–1.20), less in 2 of 3 |",
		"| cannot | – | – | – |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
