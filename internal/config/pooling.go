package config

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/leafproxy/leafproxy/proxy/pool"
)

// Pool modes (pool-mode).
const (
	PoolModeSession     = "session"
	PoolModeTransaction = "transaction"
)

// DefaultMaxPreparedStatements is max-prepared-statements' default, PgBouncer's since
// 1.24: more than the statements a typical application runs, so that a connection does
// not close and prepare its clients' statements again and again, yet a bound on what a
// server connection holds (a statement's parse tree and plans: some 8 KiB for a simple
// query, more for large ones and generic plans) when clients with statement caches (pgx
// keeps 512 per connection) or ORMs prepare thousands of distinct statements over its
// life.
const DefaultMaxPreparedStatements = 200

// Pooling holds the settings of the pools of server connections (see proxy/pool). Zero
// sizes and durations take the pool's defaults (PgBouncer's); a negative duration
// disables the timeout it names.
type Pooling struct {
	PoolMode          string        `yaml:"pool-mode"`
	PoolSize          int           `yaml:"pool-size"`
	MinPoolSize       int           `yaml:"min-pool-size"`
	ServerIdleTimeout time.Duration `yaml:"server-idle-timeout"`
	ServerLifetime    time.Duration `yaml:"server-lifetime"`
	QueryWaitTimeout  time.Duration `yaml:"query-wait-timeout"`
	MaxDBConnections  int           `yaml:"max-db-connections"`
	// MaxPreparedStatements is the most statements the proxy keeps prepared on a server
	// connection in transaction mode (PgBouncer's max_prepared_statements); 0: no limit.
	MaxPreparedStatements int `yaml:"max-prepared-statements"`
	// SessionReuse lets a server connection in session mode serve later sessions, reset
	// with DISCARD ALL (PgBouncer's server_reset_query), when the proxy authenticates
	// clients.
	SessionReuse bool `yaml:"session-reuse"`
}

func init() {
	settings = append(settings,
		setting{name: "pool-mode", arg: "MODE", usage: "session: a server connection per client session (default); transaction: clients share pools of server connections, one per (database, user), holding one only during a transaction; a databases or users entry may set its own pool_mode",
			field: func(c *Config) any { return &c.PoolMode }, check: checkPoolMode},
		setting{name: "pool-size", arg: "N", usage: "most server connections per (database, user), in session mode those of sessions the proxy authenticated (default 20); a databases or users entry may set its own pool_size",
			field: func(c *Config) any { return &c.PoolSize }, check: checkNotNegative(func(c *Config) int { return c.PoolSize })},
		setting{name: "min-pool-size", arg: "N", usage: "server connections kept open per (database, user) once used, idle or not (default 0)",
			field: func(c *Config) any { return &c.MinPoolSize }, check: checkMinPoolSize},
		setting{name: "server-idle-timeout", usage: "close a pooled server connection idle for longer (default 10m; negative: never)",
			field: func(c *Config) any { return &c.ServerIdleTimeout }},
		setting{name: "server-lifetime", usage: "close a pooled server connection older than this when it is next idle (default 1h; negative: never)",
			field: func(c *Config) any { return &c.ServerLifetime }},
		setting{name: "query-wait-timeout", usage: "how long a transaction waits for a server connection; past it the statement fails with 57014 and the session goes on; in session mode, how long a new session waits for one, then 53300 (default 2m; negative: forever)",
			field: func(c *Config) any { return &c.QueryWaitTimeout }},
		setting{name: "max-db-connections", arg: "N", usage: "most server connections per database across its users; 0: no limit",
			field: func(c *Config) any { return &c.MaxDBConnections }, check: checkNotNegative(func(c *Config) int { return c.MaxDBConnections })},
		setting{name: "max-prepared-statements", arg: "N", usage: "most statements kept prepared on a server connection in transaction mode; past it the least recently used are closed there (default 200; 0: no limit)",
			field: func(c *Config) any { return &c.MaxPreparedStatements }, check: checkNotNegative(func(c *Config) int { return c.MaxPreparedStatements })},
		setting{name: "session-reuse", usage: "in session mode, when the proxy authenticates clients (auth-type other than passthrough): a server connection its client leaves between transactions is reset with DISCARD ALL and serves the next session of the same user, database and startup parameters (default true; false: it closes with its session)",
			field: func(c *Config) any { return &c.SessionReuse }},
		setting{name: "users", alias: "user", arg: "NAME=SETTINGS", repeat: true, usage: "pool settings of the user NAME, as a PgBouncer [users] line: pool_mode=session|transaction pool_size=N; they win over the database's and the global ones; repeatable",
			field: func(c *Config) any { return &c.Users }, check: checkUsers},
	)
}

func checkPoolMode(c *Config, bad problem) {
	switch c.PoolMode {
	case "", PoolModeSession:
	case PoolModeTransaction:
		if !c.proxyAuthenticates() {
			bad(transactionNeedsAuth)
		}
	default:
		bad("%q is not one of session, transaction", c.PoolMode)
	}
}

func checkNotNegative(v func(*Config) int) func(*Config, problem) {
	return func(c *Config, bad problem) {
		if n := v(c); n < 0 {
			bad("%d must not be negative", n)
		}
	}
}

func checkMinPoolSize(c *Config, bad problem) {
	switch {
	case c.MinPoolSize < 0:
		bad("%d must not be negative", c.MinPoolSize)
	case c.PoolSize > 0 && c.MinPoolSize > c.PoolSize:
		bad("%d exceeds pool-size %d", c.MinPoolSize, c.PoolSize)
	}
}

// The pool keys of databases and users entries, written as PgBouncer writes them in its
// [databases] and [users] sections.

// parsePoolMode reads a pool_mode value into mode.
func parsePoolMode(value string, mode *string) error {
	switch value {
	case PoolModeSession, PoolModeTransaction:
		*mode = value
		return nil
	}
	return fmt.Errorf("pool_mode %q is not one of session, transaction", value)
}

// parsePoolNumber reads the value of a size key (pool_size, …): a whole number of at
// least 1, since leaving the key out is how an entry takes the global setting.
func parsePoolNumber(key, value string) (int, error) {
	n, err := strconv.Atoi(value)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s %q is not a whole number", key, value)
	case n < 1:
		return 0, fmt.Errorf("%s %d must be at least 1 (leave %s out to take the global %s)", key, n, key, strings.ReplaceAll(key, "_", "-"))
	}
	return n, nil
}

// parseLifetime reads a server_lifetime value: seconds, as PgBouncer writes it, or a
// duration such as 30m; negative: never; zero is refused (leave the key out to take the
// global server-lifetime).
func parseLifetime(value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if n, nerr := strconv.Atoi(value); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	switch {
	case err != nil:
		return 0, fmt.Errorf("server_lifetime %q is neither seconds nor a duration such as 30m", value)
	case d == 0:
		return 0, errors.New("server_lifetime 0 would close every connection after one use: leave server_lifetime out to take the global server-lifetime, or give a negative value for never")
	}
	return d, nil
}

// unknownKey is the error of a key an entry does not know, suggesting the nearest one.
func unknownKey(what, name, key string, known []string) error {
	msg := fmt.Sprintf("%s %q: unknown key %q (want %s)", what, name, key, strings.Join(known, ", "))
	if near := nearestKey(key, known); near != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", near)
	}
	return errors.New(msg)
}

// nearestKey is Nearest for the snake_case keys of entries.
func nearestKey(key string, known []string) string {
	dashed := make([]string, len(known))
	for i, k := range known {
		dashed[i] = strings.ReplaceAll(k, "_", "-")
	}
	return strings.ReplaceAll(Nearest(key, dashed), "-", "_")
}

// namedInt is a size key of an entry and its value, 0 when not given.
type namedInt struct {
	key   string
	value int
}

// appendPoolKeys appends the pool keys an entry gives, as key=value.
func appendPoolKeys(parts []string, mode string, sizes []namedInt) []string {
	if mode != "" {
		parts = append(parts, "pool_mode="+mode)
	}
	for _, s := range sizes {
		if s.value != 0 {
			parts = append(parts, s.key+"="+strconv.Itoa(s.value))
		}
	}
	return parts
}

// transactionNeedsAuth is the problem of a transaction mode set where the proxy relays
// the login.
const transactionNeedsAuth = "transaction needs the proxy to authenticate clients itself, since pooled connections are shared: set auth-type to scram-sha-256, md5 or trust (passthrough relays each client's login to its own server connection)"

// effectivePoolSize is the pool-size setting with its default.
func (c *Config) effectivePoolSize() int {
	if c.PoolSize > 0 {
		return c.PoolSize
	}
	return pool.DefaultPoolSize
}

// checkDatabasePools checks the pool keys of the databases entries against the other
// settings; checkDatabases calls it. Pools are kept per database as routed and user, so
// entries that lead to the same database of the same upstream share them: those that
// give pool limits must give the same ones.
func checkDatabasePools(c *Config, bad problem) {
	type limits struct {
		pool, min, maxDB int
		lifetime         time.Duration
	}
	shared := map[string]Database{}
	for _, d := range c.Databases {
		l := limits{d.PoolSize, d.MinPoolSize, d.MaxDBConnections, d.ServerLifetime}
		if d.Name != FallbackDatabase && l != (limits{}) {
			target := cmp.Or(d.Upstream, c.Upstream) + "\x00" + cmp.Or(d.DBName, d.Name)
			if o, ok := shared[target]; !ok {
				shared[target] = d
			} else if (limits{o.PoolSize, o.MinPoolSize, o.MaxDBConnections, o.ServerLifetime}) != l {
				bad("databases %q and %q lead to database %s of %s and so share its pools: give them the same pool_size, min_pool_size, max_db_connections and server_lifetime",
					o.Name, d.Name, cmp.Or(d.DBName, d.Name), cmp.Or(d.Upstream, c.Upstream))
			}
		}
		if d.PoolMode == PoolModeTransaction && !c.proxyAuthenticates() {
			bad("database %q: pool_mode %s", d.Name, transactionNeedsAuth)
		}
		size := c.effectivePoolSize()
		if d.PoolSize > 0 {
			size = d.PoolSize
		}
		if d.MinPoolSize > size {
			bad("database %q: min_pool_size %d exceeds its pool size %d", d.Name, d.MinPoolSize, size)
		}
	}
}

// UsesTransactionMode reports whether some sessions may run in transaction mode: by
// pool-mode, a databases entry or a users entry.
func (c *Config) UsesTransactionMode() bool {
	if c.PoolMode == PoolModeTransaction {
		return true
	}
	for _, d := range c.Databases {
		if d.PoolMode == PoolModeTransaction {
			return true
		}
	}
	for _, u := range c.Users {
		if u.PoolMode == PoolModeTransaction {
			return true
		}
	}
	return false
}
