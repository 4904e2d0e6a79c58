package config

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const testStore = "postgres://leaf@127.0.0.1:5432/app"

// load parses args as serve's flags would be, with env as the whole environment.
func load(t *testing.T, file string, env map[string]string, args ...string) (*Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := RegisterFlags(fs)
	if file != "" {
		path := filepath.Join(t.TempDir(), "leafproxy.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return Load(f, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func TestDefaults(t *testing.T) {
	c, err := load(t, "", map[string]string{"LEAFPROXY_STORE": testStore})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:6432" || c.Upstream != "127.0.0.1:5432" || c.HTTP != "127.0.0.1:8080" {
		t.Errorf("addresses: %q %q %q", c.Listen, c.Upstream, c.HTTP)
	}
	if c.WorkerSource != WorkerPostgres {
		t.Errorf("worker source without zk = %q, want postgres", c.WorkerSource)
	}
	if c.WorkerStateDir != "" {
		t.Errorf("worker-state-dir = %q with worker-source postgres, want it unset", c.WorkerStateDir)
	}
	if c.SnowflakeEpoch != DefaultSnowflakeEpoch || c.SegmentPreload != 0.9 || c.MaxBatch != 10_000 {
		t.Errorf("epoch %d, preload %v, max-batch %d", c.SnowflakeEpoch, c.SegmentPreload, c.MaxBatch)
	}
	if got := c.Origins["listen"]; got != "default" {
		t.Errorf("origin of listen = %q", got)
	}
	if c, err = load(t, "", map[string]string{"LEAFPROXY_STORE": testStore, "LEAFPROXY_ZK": "127.0.0.1:2181"}); err != nil {
		t.Fatal(err)
	}
	if c.WorkerSource != WorkerZooKeeper {
		t.Errorf("worker source with zk = %q, want zookeeper", c.WorkerSource)
	}
}

func TestWorkerStateDirDefault(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	c, err := load(t, "", map[string]string{"LEAFPROXY_STORE": testStore}, "--worker-source", "static", "--worker-id", "4")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(tmp, "leafproxy"); c.WorkerStateDir != want || DefaultWorkerStateDir() != want {
		t.Errorf("worker-state-dir = %q, DefaultWorkerStateDir() = %q, want %q", c.WorkerStateDir, DefaultWorkerStateDir(), want)
	}
	if c.Origins["worker-state-dir"] != "default" {
		t.Errorf("origin of worker-state-dir = %q, want default", c.Origins["worker-state-dir"])
	}
}

func TestPrecedence(t *testing.T) {
	file := `
store: ` + testStore + `
listen: 127.0.0.1:1001
upstream: db.file:5432
http: 127.0.0.1:2001
snowflake-tags: [file1, file2]
fill:
  - orders.id=order
log-level: debug
`
	env := map[string]string{
		"LEAFPROXY_UPSTREAM":       "db.env:5432",
		"LEAFPROXY_HTTP":           "127.0.0.1:2002",
		"LEAFPROXY_SNOWFLAKE_TAGS": "env1,env2",
	}
	c, err := load(t, file, env, "--http", "127.0.0.1:2003", "--fill", "a.id=x", "--fill", "s.b.id=y")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, got, want, origin string
	}{
		{"listen", c.Listen, "127.0.0.1:1001", "file "},
		{"upstream", c.Upstream, "db.env:5432", "env LEAFPROXY_UPSTREAM"},
		{"http", c.HTTP, "127.0.0.1:2003", "flag --http"},
		{"log-level", c.LogLevel, "debug", "file "},
		{"max-client-conns", "", "", "default"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
		if !strings.HasPrefix(c.Origins[tc.name], tc.origin) {
			t.Errorf("origin of %s = %q, want prefix %q", tc.name, c.Origins[tc.name], tc.origin)
		}
	}
	if want := (List{"env1", "env2"}); !reflect.DeepEqual(c.SnowflakeTags, want) {
		t.Errorf("snowflake-tags = %v, want %v (env over file)", c.SnowflakeTags, want)
	}
	want := []FillRule{{Table: "a", Column: "id", Tag: "x"}, {Schema: "s", Table: "b", Column: "id", Tag: "y"}}
	if !reflect.DeepEqual(c.FillRules, want) {
		t.Errorf("fill rules = %+v, want %+v (repeated flags replace the file's list)", c.FillRules, want)
	}
	if !strings.Contains(c.Origins["listen"], "leafproxy.yaml:3") {
		t.Errorf("origin of listen should name file and line, got %q", c.Origins["listen"])
	}
}

func TestTypedValuesFromEverysource(t *testing.T) {
	stateDir := t.TempDir()
	c, err := load(t, "store: "+testStore+"\nshutdown-timeout: 5s\nsegment-preload: 0.5\nmigrate-on-start: true\nworker-state-dir: "+stateDir+"\n",
		map[string]string{"LEAFPROXY_MAX_CLIENT_CONNS": "7", "LEAFPROXY_WORKER_SOURCE": "static"},
		"--worker-id", "1023", "--snowflake-epoch", "1600000000000", "--clock-max-backwards", "10ms")
	if err != nil {
		t.Fatal(err)
	}
	if c.ShutdownTimeout != 5*time.Second || c.SegmentPreload != 0.5 || !c.MigrateOnStart ||
		c.MaxClientConns != 7 || c.WorkerID != 1023 || c.WorkerSource != WorkerStatic ||
		c.SnowflakeEpoch != 1600000000000 || c.MaxBackwards != 10*time.Millisecond || c.WorkerStateDir != stateDir {
		t.Errorf("got %+v", c)
	}
	for _, src := range []struct {
		file string
		env  map[string]string
		args []string
	}{
		{"store: " + testStore + "\nmax-batch: 500\n", nil, nil},
		{"", map[string]string{"LEAFPROXY_STORE": testStore, "LEAFPROXY_MAX_BATCH": "500"}, nil},
		{"", map[string]string{"LEAFPROXY_STORE": testStore, "LEAFPROXY_MAX_BATCH": "7"}, []string{"--max-batch", "500"}},
	} {
		if c, err := load(t, src.file, src.env, src.args...); err != nil || c.MaxBatch != 500 {
			t.Errorf("max-batch from %+v: %d, %v", src, c.MaxBatch, err)
		}
	}
	c, err = load(t, "", map[string]string{"LEAFPROXY_STORE": testStore, "LEAFPROXY_MIGRATE_ON_START": "true"}, "--migrate-on-start=false")
	if err != nil || c.MigrateOnStart {
		t.Errorf("flag false over env true: %v, %v", c.MigrateOnStart, err)
	}
}

func TestErrors(t *testing.T) {
	s := map[string]string{"LEAFPROXY_STORE": testStore}
	with := func(kv ...string) map[string]string {
		m := map[string]string{"LEAFPROXY_STORE": testStore}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		args []string
		want []string // substrings of the error
	}{
		{"unknown key", "lisen: x\n", s, nil, []string{`unknown key "lisen"`, "leafproxy.yaml:1", `did you mean "listen"`}},
		{"unknown key far from any", "frobnicate: 1\n", s, nil, []string{`unknown key "frobnicate"`}},
		{"nested unknown", "store: " + testStore + "\nhttp:\n  listen: x\n", nil, nil, []string{"http", "leafproxy.yaml:2"}},
		{"duplicate key", "listen: a:1\nlisten: b:2\n", s, nil, []string{`"listen" given twice`}},
		{"not a mapping", "- a\n- b\n", s, nil, []string{"want a mapping"}},
		{"type in file", "worker-id: abc\n", s, nil, []string{"worker-id", "leafproxy.yaml:1", "!!str"}},
		{"type in env", "", with("LEAFPROXY_WORKER_ID", "x"), nil, []string{"worker-id (env LEAFPROXY_WORKER_ID)", "not an integer"}},
		{"type in flag", "", s, []string{"--max-client-conns", "many"}, []string{"max-client-conns", "not an integer"}},
		{"bad duration", "", with("LEAFPROXY_SHUTDOWN_TIMEOUT", "soon"), nil, []string{"shutdown-timeout", "not a duration"}},
		{"store missing", "", nil, nil, []string{"store (default): required"}},
		{"store not url", "", with("LEAFPROXY_STORE", "host=x dbname=y"), nil, []string{"store (env LEAFPROXY_STORE)", "scheme"}},
		{"store mysql", "", with("LEAFPROXY_STORE", "mysql://u@h/db"), nil, []string{"store", `scheme "mysql"`}},
		{"listen", "", s, []string{"--listen", "6432"}, []string{"listen (flag --listen)", "not host:port"}},
		{"upstream port", "", s, []string{"--upstream", "db:99999"}, []string{"upstream", "bad port"}},
		{"http", "", s, []string{"--http", "nope"}, []string{"http (flag --http)", "not host:port"}},
		{"sslmode", "", s, []string{"--upstream-sslmode", "always"}, []string{"upstream-sslmode", `"always" is not one of`}},
		{"upstream-ca missing", "", s, []string{"--upstream-ca", "/nonexistent/ca.pem"}, []string{"upstream-ca", "no such file"}},
		{"tls half", "", s, []string{"--tls-cert", "/x.pem"}, []string{"tls-key", "together"}},
		{"tls unreadable", "", s, []string{"--tls-cert", "/x.pem", "--tls-key", "/y.pem"}, []string{"tls-cert", "cannot load"}},
		{"static without id", "", s, []string{"--worker-source", "static"}, []string{"worker-id (default): required with worker-source static"}},
		{"worker id range", "", s, []string{"--worker-source", "static", "--worker-id", "1024"}, []string{"worker-id (flag --worker-id)", "outside 0..1023"}},
		{"worker id without static", "", s, []string{"--worker-id", "3"}, []string{"only used with worker-source static"}},
		{"state dir without static", "", s, []string{"--worker-state-dir", "/var/lib/leafproxy"}, []string{"worker-state-dir (flag --worker-state-dir)", "only used with worker-source static"}},
		{"state dir is a file", "", with("LEAFPROXY_WORKER_STATE_DIR", "/dev/null"), []string{"--worker-source", "static", "--worker-id", "1"}, []string{"worker-state-dir (env LEAFPROXY_WORKER_STATE_DIR)", "/dev/null is not a directory"}},
		{"zookeeper without zk", "", s, []string{"--worker-source", "zookeeper"}, []string{"zk (default): required with worker-source zookeeper"}},
		{"bad source", "", s, []string{"--worker-source", "etcd"}, []string{"worker-source", `"etcd" is not one of`}},
		{"bad zk", "", s, []string{"--zk", "a:1,b"}, []string{"zk (flag --zk)", `"b" is not host:port`}},
		{"zk name", "", s, []string{"--zk-name", "a/b"}, []string{"zk-name", "without '/'"}},
		{"advertise", "", s, []string{"--advertise", "x"}, []string{"advertise", "not host:port"}},
		{"dup snowflake tag", "", s, []string{"--snowflake-tags", "a,b,a"}, []string{"snowflake-tags", `"a" listed twice`}},
		{"bad snowflake tag", "", s, []string{"--snowflake-tags", "a/b"}, []string{"snowflake-tags", "'/'"}},
		{"epoch future", "", s, []string{"--snowflake-epoch", "99999999999999"}, []string{"snowflake-epoch", "between 0 and now"}},
		{"backwards", "", s, []string{"--clock-max-backwards", "2s"}, []string{"clock-max-backwards", "between 0 and 1s"}},
		{"lease ttl short", "", s, []string{"--worker-lease-ttl", "500ms"}, []string{"worker-lease-ttl", "at least 1s"}},
		{"lease ttl static", "", s, []string{"--worker-source", "static", "--worker-id", "1", "--worker-lease-ttl", "5s"}, []string{"worker-lease-ttl", "only used with worker-source postgres"}},
		{"fill no tag", "", s, []string{"--fill", "orders.id"}, []string{"fill (flag --fill)", "want [schema.]table.column=tag"}},
		{"fill one name", "", s, []string{"--fill", "orders=order"}, []string{"fill", "got 1 names"}},
		{"fill four names", "", s, []string{"--fill", "a.b.c.d=x"}, []string{"fill", "got 4 names"}},
		{"fill dup table", "", s, []string{"--fill", "orders.id=a", "--fill", "Orders.key=b"}, []string{"fill", "table orders has two rules"}},
		{"fill unterminated", "", s, []string{"--fill", `"orders.id=a`}, []string{"fill", "unterminated"}},
		{"preload", "", s, []string{"--segment-preload", "1"}, []string{"segment-preload", "strictly between 0 and 1"}},
		{"conns", "", s, []string{"--max-client-conns", "0"}, []string{"max-client-conns", "at least 1"}},
		{"batch zero", "", s, []string{"--max-batch", "0"}, []string{"max-batch", "between 1 and 1000000"}},
		{"batch huge", "", s, []string{"--max-batch", "1000001"}, []string{"max-batch", "between 1 and 1000000"}},
		{"message size", "", s, []string{"--max-message-size", "10"}, []string{"max-message-size", "minimum"}},
		{"event loops", "", s, []string{"--event-loops", "-2"}, []string{"event-loops", "must be -1 (none), 0 (automatic)"}},
		{"shutdown", "", s, []string{"--shutdown-timeout", "0s"}, []string{"shutdown-timeout", "positive"}},
		{"log level", "", s, []string{"--log-level", "loud"}, []string{"log-level", `"loud"`}},
		{"log format", "", s, []string{"--log-format", "xml"}, []string{"log-format", `"xml" is not one of text, json`}},
		{"token space", "", with("LEAFPROXY_HTTP_TOKEN", "a b"), nil, []string{"http-token (env LEAFPROXY_HTTP_TOKEN)", "white space"}},
		{"several at once", "", nil, []string{"--listen", "x", "--log-format", "xml"}, []string{"listen", "log-format", "store"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.file, tc.env, tc.args...)
			if err == nil {
				t.Fatalf("no error; want one containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseFillRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want FillRule
	}{
		{"orders.id=order", FillRule{Table: "orders", Column: "id", Tag: "order"}},
		{"Shop.Orders.ID=order", FillRule{Schema: "shop", Table: "orders", Column: "id", Tag: "order"}},
		{`"Order Lines".id=line`, FillRule{Table: "Order Lines", Column: "id", Tag: "line"}},
		{`s."a.b"."x""y"=t`, FillRule{Schema: "s", Table: "a.b", Column: `x"y`, Tag: "t"}},
		{" orders.id = order ", FillRule{Table: "orders", Column: "id", Tag: "order"}},
	} {
		got, err := ParseFillRule(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseFillRule(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "=x", "orders.id=", "orders..id=x", `"a"b.id=x`, "a b.id=x"} {
		if r, err := ParseFillRule(bad); err == nil {
			t.Errorf("ParseFillRule(%q) = %+v, want an error", bad, r)
		}
	}
}

func TestEveryKeyHasAFlagAndEnv(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	RegisterFlags(fs)
	tags := map[string]bool{}
	var collect func(typ reflect.Type)
	collect = func(typ reflect.Type) {
		for i := 0; i < typ.NumField(); i++ {
			switch tag := typ.Field(i).Tag.Get("yaml"); {
			case tag == ",inline":
				collect(typ.Field(i).Type)
			case tag != "" && tag != "-":
				tags[tag] = true
			}
		}
	}
	collect(reflect.TypeOf(Config{}))
	for _, name := range Names() {
		if fs.Lookup(name) == nil {
			t.Errorf("setting %s has no flag", name)
		}
		if !tags[name] {
			t.Errorf("setting %s has no Config field with that yaml tag", name)
		}
		delete(tags, name)
		if !strings.Contains(fs.Lookup(name).Usage, EnvName(name)) {
			t.Errorf("help of --%s does not name %s", name, EnvName(name))
		}
	}
	for tag := range tags {
		t.Errorf("Config field %s is not in the settings table", tag)
	}
}

func TestPoolingSettings(t *testing.T) {
	c := Defaults()
	if c.PoolMode != PoolModeSession {
		t.Fatalf("default pool-mode %q, want session", c.PoolMode)
	}
	c.Store = "postgres://leaf@127.0.0.1:5432/app"
	c.PoolMode = "statement"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "not one of session, transaction") {
		t.Fatalf("Validate: %v", err)
	}
	c.PoolMode = PoolModeTransaction
	c.PoolSize = 2
	c.MinPoolSize = 3
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), `pool-mode (default): transaction needs the proxy to authenticate clients itself`) ||
		!strings.Contains(err.Error(), "min-pool-size (default): 3 exceeds pool-size 2") {
		t.Fatalf("Validate: %v", err)
	}
}
