package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestDatabasesFromYAMLFlagsAndEnv(t *testing.T) {
	env := map[string]string{"LEAFPROXY_STORE": testStore}
	file := `
databases:
  app: host=10.0.0.5 port=5433 dbname=app_prod
  reports:
    upstream: /var/run/postgresql/.s.PGSQL.5432
  sock: host=/var/run/postgresql dbname='my db'
  renamed: dbname=other
  "*": host=::1
`
	c, err := load(t, file, env)
	if err != nil {
		t.Fatal(err)
	}
	want := Databases{
		{Name: "app", Upstream: "10.0.0.5:5433", DBName: "app_prod"},
		{Name: "reports", Upstream: "/var/run/postgresql/.s.PGSQL.5432"},
		{Name: "sock", Upstream: "/var/run/postgresql/.s.PGSQL.5432", DBName: "my db"},
		{Name: "renamed", DBName: "other"},
		{Name: "*", Upstream: "[::1]:5432"},
	}
	if !reflect.DeepEqual(c.Databases, want) {
		t.Errorf("from the file:\n got %+v\nwant %+v", c.Databases, want)
	}
	if d, ok := c.Databases.Lookup("nosuch"); !ok || d.Name != "*" {
		t.Errorf("Lookup(nosuch) = %+v, %v; want the * entry", d, ok)
	}
	addrs := c.UpstreamAddrs()
	if got := addrs["127.0.0.1:5432"]; !reflect.DeepEqual(got, []string{"renamed"}) {
		t.Errorf("UpstreamAddrs: %v", addrs)
	}

	// Flags replace the file's entries and add up; the PgBouncer line moves over as is.
	c, err = load(t, file, env, "--database", "app=host=10.0.0.5 port=5432 dbname=app_prod",
		"--database", "b = host=db2")
	if err != nil {
		t.Fatal(err)
	}
	want = Databases{{Name: "app", Upstream: "10.0.0.5:5432", DBName: "app_prod"}, {Name: "b", Upstream: "db2:5432"}}
	if !reflect.DeepEqual(c.Databases, want) {
		t.Errorf("from flags: got %+v, want %+v", c.Databases, want)
	}
	if _, ok := c.Databases.Lookup("nosuch"); ok {
		t.Error("Lookup found an entry without a * entry")
	}

	env["LEAFPROXY_DATABASES"] = "app=upstream=10.1.1.1:6000; *=dbname=fallback"
	if c, err = load(t, file, env); err != nil {
		t.Fatal(err)
	}
	want = Databases{{Name: "app", Upstream: "10.1.1.1:6000"}, {Name: "*", DBName: "fallback"}}
	if !reflect.DeepEqual(c.Databases, want) {
		t.Errorf("from env: got %+v, want %+v", c.Databases, want)
	}
	if got := c.Origins["databases"]; got != "env LEAFPROXY_DATABASES" {
		t.Errorf("origin %q", got)
	}
	// What String renders reads back the same.
	var back Databases
	if err := back.Set(c.Databases.String()); err != nil || !reflect.DeepEqual(back, c.Databases) {
		t.Errorf("round trip of %q: %+v, %v", c.Databases.String(), back, err)
	}
}

func TestDatabasesErrorsNameTheKey(t *testing.T) {
	env := map[string]string{"LEAFPROXY_STORE": testStore}
	for _, tc := range []struct {
		file  string
		flags []string
		want  []string
	}{
		{file: "databases:\n  app: host=h dbnme=x\n", want: []string{"databases: line 2", `database "app"`, `unknown key "dbnme"`, `did you mean "dbname"`}},
		{file: "databases:\n  app: {host: h, colour: red}\n", want: []string{`database "app"`, `unknown key "colour"`}},
		{flags: []string{"--database", "app=host=h connect_query=x"}, want: []string{`key "connect_query" is not supported`}},
		{flags: []string{"--database", "app=host=h reserve_pool_size=5"}, want: []string{"flag -database", `key "reserve_pool_size" is not supported`, "raise pool_size"}},
		{flags: []string{"--database", "app=host=h user=bob"}, want: []string{`key "user" is not supported`, "logs in as itself"}},
		{flags: []string{"--database", "app=host=h", "--database", "app=host=k"}, want: []string{`database "app" is given twice`}},
		{flags: []string{"--database", "app=host=h port=70000"}, want: []string{`port "70000"`}},
		{flags: []string{"--database", "app=port=5432"}, want: []string{"port without host"}},
		{flags: []string{"--database", "app=upstream=h:1 host=h"}, want: []string{"not both"}},
		{flags: []string{"--database", "app=upstream=nohostport"}, want: []string{"databases (flag --databases)", `database "app": upstream "nohostport" is not host:port`}},
		{flags: []string{"--database", "app"}, want: []string{"NAME=KEY=VALUE", "dbname=app_prod"}},
		{flags: []string{"--database", "app=dbname='x"}, want: []string{"closing quote"}},
		{flags: []string{"--database", "app=host"}, want: []string{`"host" has no value`}},
		{file: "databases: [a, b]\n", want: []string{"databases", "want a mapping"}},
	} {
		_, err := load(t, tc.file, env, tc.flags...)
		if err == nil {
			t.Errorf("%q %q: no error", tc.file, tc.flags)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q %q: error %q lacks %q", tc.file, tc.flags, err, w)
			}
		}
	}
}

func TestDatabasesUnsetRoutesToUpstream(t *testing.T) {
	c, err := load(t, "", map[string]string{"LEAFPROXY_STORE": testStore}, "--upstream", "10.9.9.9:5432")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Databases) != 0 {
		t.Fatalf("databases = %+v", c.Databases)
	}
	if got := c.UpstreamAddrs(); !reflect.DeepEqual(got, map[string][]string{"10.9.9.9:5432": {"*"}}) {
		t.Errorf("UpstreamAddrs = %v", got)
	}
}
