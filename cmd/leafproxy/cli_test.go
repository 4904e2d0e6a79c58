package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/testenv"
)

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"serve", "migrate", "tag", "decode", "healthcheck", "version"}},
		{[]string{"serve", "--help"}, append(config.Names(), "config", "LEAFPROXY_WORKER_SOURCE", "flag wins over the environment")},
		{[]string{"migrate", "--help"}, []string{"up", "down", "version", "force", "-dsn", "-yes"}},
		{[]string{"tag", "--help"}, []string{"add NAME --step N", "list", "set-step", "set-max-id", "remove"}},
		{[]string{"tag", "add", "--help"}, []string{"-step", "-max-id", "-description", "-dsn"}},
		{[]string{"tag", "list", "--help"}, []string{"-json", "-dsn"}},
		{[]string{"tag", "set-step", "--help"}, []string{"NAME N", "-dsn"}},
		{[]string{"tag", "remove", "--help"}, []string{"NAME", "-dsn"}},
		{[]string{"decode", "--help"}, []string{"-snowflake-epoch", "-config", "ID"}},
		{[]string{"healthcheck", "--help"}, []string{"-http", "-path"}},
	} {
		r := leafproxy(t, nil, tc.args...)
		out := r.stdout + r.stderr
		if r.code != 0 {
			t.Errorf("leafproxy %v: exit %d", tc.args, r.code)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("leafproxy %v does not mention %q:\n%s", tc.args, w, out)
			}
		}
	}
	if r := leafproxy(t, nil, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "leafproxy ") {
		t.Errorf("version: %+v", r)
	}
	if r := leafproxy(t, nil, "frobnicate"); r.code != 2 || !strings.Contains(r.stderr, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %+v", r)
	}
}

// TestServeConfigErrors checks that serve refuses a bad configuration before doing
// anything, naming the key and where the value came from, with exit status 2.
func TestServeConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := 0
	file := func(body string) string {
		n++
		p := filepath.Join(dir, fmt.Sprintf("leafproxy-%d.yaml", n))
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	store := "LEAFPROXY_STORE=postgres://leaf@127.0.0.1:1/x"
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"unknown key", []string{store}, []string{"--config", file("listen: 127.0.0.1:1\nworker_source: static\n")},
			[]string{`unknown key "worker_source"`, `did you mean "worker-source"`, ":2"}},
		{"no store", nil, nil, []string{"store (default): required"}},
		{"bad env", []string{store, "LEAFPROXY_WORKER_ID=seven"}, nil, []string{"worker-id (env LEAFPROXY_WORKER_ID)", "not an integer"}},
		{"flag beats env in the message", []string{store, "LEAFPROXY_LOG_FORMAT=json"}, []string{"--log-format", "xml"},
			[]string{`log-format (flag --log-format): "xml" is not one of text, json`}},
		{"env beats file", []string{store, "LEAFPROXY_MAX_CLIENT_CONNS=-1"}, []string{"--config", file("max-client-conns: 5\n")},
			[]string{"max-client-conns (env LEAFPROXY_MAX_CLIENT_CONNS): -1 must be at least 1"}},
		{"file value reported with its line", []string{store}, []string{"--config", file("\n\nsegment-preload: 2\n")},
			[]string{"segment-preload (file ", ".yaml:3): 2 must be a fraction"}},
		{"zookeeper needs zk", []string{store}, []string{"--worker-source", "zookeeper"}, []string{"zk (default): required with worker-source zookeeper"}},
		{"bad flag value", []string{store}, []string{"--shutdown-timeout", "forever"}, []string{"shutdown-timeout", "not a duration"}},
		{"stray argument", []string{store}, []string{"extra"}, []string{`unexpected arguments ["extra"]`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := leafproxy(t, tc.env, append([]string{"serve"}, tc.args...)...)
			if r.code != 2 {
				t.Errorf("exit %d, want 2; stderr:\n%s", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	if out := mustRun(t, "migrate", "version", "--dsn", dsn); !strings.Contains(out, "version 0 of 3") {
		t.Errorf("fresh version: %q", out)
	}
	if out := mustRun(t, "migrate", "up", "--dsn", dsn); !strings.Contains(out, "version 3 of 3") {
		t.Errorf("after up: %q", out)
	}
	mustRun(t, "migrate", "up", "--dsn", dsn) // a second up changes nothing and succeeds
	r := leafproxy(t, nil, "migrate", "down", "--dsn", dsn)
	if r.code != 2 || !strings.Contains(r.stderr, "pass --yes") {
		t.Errorf("down without --yes: %+v", r)
	}
	mustRun(t, "tag", "add", "t1", "--step", "10", "--dsn", dsn) // the schema is still there
	if out := mustRun(t, "migrate", "down", "--yes", "--dsn", dsn); !strings.Contains(out, "version 0 of 3") {
		t.Errorf("after down: %q", out)
	}
	if r := leafproxy(t, nil, "tag", "list", "--dsn", dsn); r.code != 1 || !strings.Contains(r.stderr, "migrate up") {
		t.Errorf("tag list without schema should point at migrate up: %+v", r)
	}
	// The DSN may come from LEAFPROXY_STORE, the variable serve reads.
	if r := leafproxy(t, []string{"LEAFPROXY_STORE=" + dsn}, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "version 3 of 3") {
		t.Errorf("up again via LEAFPROXY_STORE: %+v", r)
	}
	mustRun(t, "migrate", "force", "1", "--dsn", dsn)
	if out := mustRun(t, "migrate", "version", "--dsn", dsn); !strings.Contains(out, "version 1 of 3") {
		t.Errorf("after force 1: %q", out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "missing subcommand"},
		{[]string{"migrate", "sideways", "--dsn", dsn}, `unknown subcommand "sideways"`},
		{[]string{"migrate", "force", "--dsn", dsn}, "want 1 argument"},
		{[]string{"migrate", "force", "x", "--dsn", dsn}, "must be an integer"},
		{[]string{"migrate", "up", "--dsn", "host=x dbname=y"}, "--dsn"},
		{[]string{"migrate", "up"}, "no store given: pass --dsn URL or set LEAFPROXY_STORE"},
	} {
		if r := leafproxy(t, nil, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("leafproxy %v: exit %d, stderr %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestTagCommands(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDatabase(t)
	mustRun(t, "migrate", "up", "--dsn", dsn)
	if out := mustRun(t, "tag", "add", "order", "--step", "1000", "--description", "orders", "--dsn", dsn); !strings.Contains(out, "first ID 2") {
		t.Errorf("add: %q", out)
	}
	mustRun(t, "tag", "add", "--dsn", dsn, "--step", "5", "--max-id", "100", "audit") // flags before the name
	mustRun(t, "tag", "set-step", "order", "2000", "--dsn", dsn)
	mustRun(t, "tag", "set-max-id", "order", "5000", "--dsn", dsn)
	var tags []struct {
		Tag         string `json:"tag"`
		MaxID       int64  `json:"max_id"`
		Step        int64  `json:"step"`
		Description string `json:"description"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "tag", "list", "--json", "--dsn", dsn)), &tags); err != nil {
		t.Fatal(err)
	}
	if len(tags) != 2 || tags[0].Tag != "audit" || tags[0].MaxID != 100 || tags[0].Step != 5 ||
		tags[1].Tag != "order" || tags[1].MaxID != 5000 || tags[1].Step != 2000 || tags[1].Description != "orders" {
		t.Errorf("tag list --json = %+v", tags)
	}
	table := mustRun(t, "tag", "list", "--dsn", dsn)
	if !strings.Contains(table, "TAG") || !strings.Contains(table, "order") || !strings.Contains(table, "5000") {
		t.Errorf("tag list:\n%s", table)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"duplicate", []string{"tag", "add", "order", "--step", "10"}, 1, `tag already exists: "order"`},
		{"step zero", []string{"tag", "add", "x", "--step", "0"}, 1, "step must be at least 1"},
		{"step negative", []string{"tag", "add", "x", "--step", "-3"}, 1, "step must be at least 1"},
		{"step missing", []string{"tag", "add", "x"}, 2, "--step is required"},
		{"negative max-id", []string{"tag", "add", "x", "--step", "1", "--max-id", "-1"}, 1, "max-id must not be negative"},
		{"bad name", []string{"tag", "add", "a/b", "--step", "1"}, 1, "bad tag name"},
		{"two names", []string{"tag", "add", "a", "b", "--step", "1"}, 2, "exactly one tag NAME"},
		{"set-step zero", []string{"tag", "set-step", "order", "0"}, 1, "step must be at least 1"},
		{"set-step not a number", []string{"tag", "set-step", "order", "many"}, 2, "not an integer"},
		{"set-step unknown", []string{"tag", "set-step", "nope", "5"}, 1, `no such tag: "nope"`},
		{"set-max-id lower", []string{"tag", "set-max-id", "order", "4999"}, 1, `max-id may only grow: "order" is at 5000, refusing 4999`},
		{"set-max-id unknown", []string{"tag", "set-max-id", "nope", "5"}, 1, "no such tag"},
		{"remove unknown", []string{"tag", "remove", "nope"}, 1, `no such tag: "nope"`},
		{"unknown subcommand", []string{"tag", "rename", "a", "b"}, 2, `unknown subcommand "rename"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := leafproxy(t, nil, append(tc.args, "--dsn", dsn)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
	if out := mustRun(t, "tag", "remove", "order", "--dsn", dsn); !strings.Contains(out, "--max-id 5000") {
		t.Errorf("remove should say how to re-create safely: %q", out)
	}
	if out := mustRun(t, "tag", "list", "--json", "--dsn", dsn); strings.Contains(out, `"order"`) {
		t.Errorf("order still listed after remove: %s", out)
	}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 4, 5, 6, 7, 890e6, time.UTC)
	for _, tc := range []struct {
		name  string
		epoch int64
		env   []string
		args  []string
	}{
		{"default epoch", snowflake.DefaultEpochMillis, nil, nil},
		{"flag", 1600000000000, nil, []string{"--snowflake-epoch", "1600000000000"}},
		{"env", 1500000000000, []string{"LEAFPROXY_SNOWFLAKE_EPOCH=1500000000000"}, nil},
		{"file", 1400000000000, nil, []string{"--config", writeFile(t, "snowflake-epoch: 1400000000000\nstore: postgres://x@h/db\n")}},
		{"flag over env", 1600000000000, []string{"LEAFPROXY_SNOWFLAKE_EPOCH=1500000000000"}, []string{"--snowflake-epoch", "1600000000000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			codec, err := snowflake.NewCodec(snowflake.Layout{}, time.UnixMilli(tc.epoch))
			if err != nil {
				t.Fatal(err)
			}
			id, err := codec.Compose(snowflake.Parts{Time: at, Millis: at.UnixMilli(), Worker: 613, Sequence: 4000})
			if err != nil {
				t.Fatal(err)
			}
			r := leafproxy(t, tc.env, append(append([]string{"decode"}, tc.args...), itoa(id))...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			var got struct {
				Timestamp int64     `json:"timestamp"`
				Time      time.Time `json:"time"`
				Worker    int64     `json:"worker"`
				Sequence  int64     `json:"sequence"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v: %q", err, r.stdout)
			}
			if got.Timestamp != at.UnixMilli() || !got.Time.Equal(at) || got.Worker != 613 || got.Sequence != 4000 {
				t.Errorf("decode %d = %+v", id, got)
			}
		})
	}
	if r := leafproxy(t, nil, "decode", "12ab"); r.code != 2 || !strings.Contains(r.stderr, "not a non-negative 64-bit integer") {
		t.Errorf("bad ID: %+v", r)
	}
	if r := leafproxy(t, nil, "decode"); r.code != 2 || !strings.Contains(r.stderr, "no ID given") {
		t.Errorf("no ID: %+v", r)
	}
	if r := leafproxy(t, nil, "decode", "--config", writeFile(t, "epoch: 1\n"), "1"); r.code != 1 || !strings.Contains(r.stderr, `unknown key "epoch"`) {
		t.Errorf("bad file: %+v", r)
	}
	if r := leafproxy(t, nil, "decode", "1", "2", "3"); r.code != 0 || strings.Count(r.stdout, "\n") != 3 {
		t.Errorf("three IDs: %+v", r)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "leafproxy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
