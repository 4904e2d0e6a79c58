package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// scramEnv is an environment whose proxy authenticates clients, as transaction mode
// needs.
func scramEnv() map[string]string {
	return map[string]string{"LEAFPROXY_STORE": testStore, "LEAFPROXY_AUTH_TYPE": AuthSCRAM, "LEAFPROXY_AUTH_USER": "leafproxy_auth"}
}

// TestPoolKeysPerDatabaseAndUser reads pool_mode and the sizes of databases entries and
// the users setting from the file, the flags and the environment, and renders them back.
func TestPoolKeysPerDatabaseAndUser(t *testing.T) {
	file := `
pool-mode: session
pool-size: 10
databases:
  shop: host=db1 port=5432 dbname=shop pool_mode=transaction pool_size=30
  reports: {host: db2, pool_mode: session, min_pool_size: 2, max_db_connections: 8}
  archive: host=db4 server_lifetime=600
  "*": host=db3
users:
  reporting: pool_mode=session
  batch: {pool_size: 5, pool_mode: transaction}
`
	c, err := load(t, file, scramEnv())
	if err != nil {
		t.Fatal(err)
	}
	wantDBs := Databases{
		{Name: "shop", Upstream: "db1:5432", DBName: "shop", PoolMode: PoolModeTransaction, PoolSize: 30},
		{Name: "reports", Upstream: "db2:5432", PoolMode: PoolModeSession, MinPoolSize: 2, MaxDBConnections: 8},
		{Name: "archive", Upstream: "db4:5432", ServerLifetime: 10 * time.Minute},
		{Name: "*", Upstream: "db3:5432"},
	}
	if !reflect.DeepEqual(c.Databases, wantDBs) {
		t.Errorf("databases:\n got %+v\nwant %+v", c.Databases, wantDBs)
	}
	wantUsers := Users{{Name: "reporting", PoolMode: PoolModeSession}, {Name: "batch", PoolMode: PoolModeTransaction, PoolSize: 5}}
	if !reflect.DeepEqual(c.Users, wantUsers) {
		t.Errorf("users:\n got %+v\nwant %+v", c.Users, wantUsers)
	}
	if u, ok := c.Users.Lookup("batch"); !ok || u.PoolSize != 5 {
		t.Errorf("Lookup(batch) = %+v, %v", u, ok)
	}
	for _, round := range []struct {
		what string
		back interface{ Set(string) error }
		want any
	}{{"databases", new(Databases), &c.Databases}, {"users", new(Users), &c.Users}} {
		s := fieldOfName(c, round.what).(interface{ String() string }).String()
		if err := round.back.Set(s); err != nil || !reflect.DeepEqual(round.back, round.want) {
			t.Errorf("round trip of %s %q: %+v, %v", round.what, s, round.back, err)
		}
	}

	// Flags replace the file's entries; the PgBouncer lines move over as they are.
	c, err = load(t, file, scramEnv(), "--database", "shop=host=db1 port=5432 dbname=shop pool_mode=transaction pool_size=30",
		"--user", "alice=pool_mode=session", "--user", "bob=pool_size=3")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Users{{Name: "alice", PoolMode: PoolModeSession}, {Name: "bob", PoolSize: 3}}); !reflect.DeepEqual(c.Users, want) {
		t.Errorf("users from flags: %+v", c.Users)
	}
	if got := c.Origins["users"]; got != "flag --users" {
		t.Errorf("origin of users: %q", got)
	}
	env := scramEnv()
	env["LEAFPROXY_USERS"] = "alice=pool_mode=transaction; bob=pool_size=4"
	if c, err = load(t, "", env); err != nil {
		t.Fatal(err)
	}
	if want := (Users{{Name: "alice", PoolMode: PoolModeTransaction}, {Name: "bob", PoolSize: 4}}); !reflect.DeepEqual(c.Users, want) {
		t.Errorf("users from env: %+v", c.Users)
	}
}

// fieldOfName is the field of a setting by name.
func fieldOfName(c *Config, name string) any {
	s, _ := lookup(name)
	return s.field(c)
}

// TestPoolKeysErrors: bad pool keys of databases and users entries are refused with a
// message naming the entry, the key and what is allowed.
func TestPoolKeysErrors(t *testing.T) {
	for _, tc := range []struct {
		file  string
		env   map[string]string
		flags []string
		want  []string
	}{
		{flags: []string{"--database", "app=host=h pool_mode=statement"}, want: []string{"flag -database", `database "app"`, `pool_mode "statement" is not one of session, transaction`}},
		{flags: []string{"--database", "app=host=h pool_size=0"}, want: []string{`database "app"`, "pool_size 0 must be at least 1", "global pool-size"}},
		{flags: []string{"--database", "app=host=h pool_size=-3"}, want: []string{"pool_size -3 must be at least 1"}},
		{flags: []string{"--database", "app=host=h pool_size=many"}, want: []string{`pool_size "many" is not a whole number`}},
		{flags: []string{"--database", "app=host=h min_pool_size=0"}, want: []string{"min_pool_size 0 must be at least 1"}},
		{flags: []string{"--database", "app=host=h max_db_connections=0"}, want: []string{"max_db_connections 0 must be at least 1"}},
		{flags: []string{"--database", "app=host=h server_lifetime=0"}, want: []string{`database "app": server_lifetime 0 would close every connection`}},
		{flags: []string{"--database", "app=host=h server_lifetime=soon"}, want: []string{`server_lifetime "soon" is neither seconds nor a duration`}},
		{flags: []string{"--database", "app=host=h pool_sise=3"}, want: []string{`unknown key "pool_sise"`, `did you mean "pool_size"?`}},
		{file: "databases:\n  app: {host: h, pool_mode: txn}\n", want: []string{"databases: line 2", `pool_mode "txn"`}},
		{flags: []string{"--database", "app=host=h min_pool_size=30"}, want: []string{"databases (flag --databases)", `database "app": min_pool_size 30 exceeds its pool size 20`}},
		{flags: []string{"--database", "app=host=h pool_size=5 min_pool_size=6"}, want: []string{"min_pool_size 6 exceeds its pool size 5"}},
		{flags: []string{"--database", "app=host=h dbname=shop pool_size=5", "--database", "alias=host=h dbname=shop pool_size=6"},
			want: []string{`databases "app" and "alias" lead to database shop of h:5432 and so share its pools`}},
		{flags: []string{"--database", "app=host=h dbname=shop server_lifetime=60", "--database", "alias=host=h dbname=shop server_lifetime=1h"},
			want: []string{"share its pools", "server_lifetime"}},
		{env: map[string]string{}, flags: []string{"--database", "app=host=h pool_mode=transaction"},
			want: []string{"databases (flag --databases)", `database "app": pool_mode transaction needs the proxy to authenticate clients itself`, "auth-type"}},
		{env: map[string]string{}, flags: []string{"--user", "alice=pool_mode=transaction"},
			want: []string{"users (flag --users)", `user "alice": pool_mode transaction needs the proxy to authenticate`}},
		{flags: []string{"--user", "alice=pool_mode=statement"}, want: []string{"flag -user", `user "alice": pool_mode "statement"`}},
		{flags: []string{"--user", "alice=pool_size=0"}, want: []string{`user "alice": pool_size 0 must be at least 1`}},
		{flags: []string{"--user", "alice=pool_mdoe=session"}, want: []string{`user "alice": unknown key "pool_mdoe" (want pool_mode, pool_size)`, `did you mean "pool_mode"?`}},
		{flags: []string{"--user", "alice=max_user_connections=5"}, want: []string{`key "max_user_connections" is not supported`}},
		{flags: []string{"--user", "alice"}, want: []string{"NAME=KEY=VALUE", "reporting=pool_mode=session"}},
		{flags: []string{"--user", "alice=pool_size=2", "--user", "alice=pool_size=3"}, want: []string{`user "alice" is given twice`}},
		{file: "users:\n  alice: \"\"\n", want: []string{"users: line 2", `user "alice" sets nothing`}},
		{file: "users: [alice]\n", want: []string{"users", "want a mapping of user names"}},
		{flags: []string{"--max-prepared-statements", "-1"}, want: []string{"max-prepared-statements", "-1 must not be negative"}},
	} {
		env := scramEnv()
		if tc.env != nil {
			env = map[string]string{"LEAFPROXY_STORE": testStore}
		}
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

// TestSessionEntriesNeedNoProxyAuth: with passthrough, databases and users in session
// mode are fine, and so is a global session mode; entries sharing a database may differ
// in pool_mode, and one that gives no sizes takes the other's.
func TestSessionEntriesNeedNoProxyAuth(t *testing.T) {
	c, err := load(t, "", map[string]string{"LEAFPROXY_STORE": testStore},
		"--database", "app=host=h pool_mode=session pool_size=3", "--user", "alice=pool_mode=session",
		"--database", "alias=host=h dbname=app pool_mode=session", "--database", "again=host=h dbname=app pool_size=3")
	if err != nil {
		t.Fatal(err)
	}
	if c.UsesTransactionMode() {
		t.Error("UsesTransactionMode with every mode session")
	}
	var never Databases
	if err := never.Set("app=host=h server_lifetime=-1s; b=host=h server_lifetime=90m"); err != nil ||
		never[0].ServerLifetime != -time.Second || never[1].ServerLifetime != 90*time.Minute {
		t.Errorf("server_lifetime -1s, 90m: %+v, %v", never, err)
	}
	for _, args := range [][]string{{"--pool-mode", "transaction"}, {"--database", "a=host=h pool_mode=transaction"}, {"--user", "u=pool_mode=transaction"}} {
		c, err := load(t, "", scramEnv(), args...)
		if err != nil {
			t.Fatal(err)
		}
		if !c.UsesTransactionMode() {
			t.Errorf("%q: UsesTransactionMode false", args)
		}
	}
}

// TestMaxPreparedStatements: max-prepared-statements is PgBouncer's 200 unless set, from
// the file, the environment or a flag, and 0 (no limit) is allowed.
func TestMaxPreparedStatements(t *testing.T) {
	c, err := load(t, "", scramEnv())
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxPreparedStatements != DefaultMaxPreparedStatements || DefaultMaxPreparedStatements != 200 {
		t.Fatalf("default: %d", c.MaxPreparedStatements)
	}
	env := scramEnv()
	env["LEAFPROXY_MAX_PREPARED_STATEMENTS"] = "50"
	for _, tc := range []struct {
		file  string
		env   map[string]string
		flags []string
		want  int
	}{
		{file: "max-prepared-statements: 0\n", env: scramEnv(), want: 0},
		{file: "max-prepared-statements: 1000\n", env: env, want: 50},
		{file: "max-prepared-statements: 1000\n", env: env, flags: []string{"--max-prepared-statements", "7"}, want: 7},
	} {
		c, err := load(t, tc.file, tc.env, tc.flags...)
		if err != nil {
			t.Errorf("%q %q: %v", tc.file, tc.flags, err)
		} else if c.MaxPreparedStatements != tc.want {
			t.Errorf("%q %q: %d, want %d", tc.file, tc.flags, c.MaxPreparedStatements, tc.want)
		}
	}
}
