package config

import "time"

// Pool modes (pool-mode).
const (
	PoolModeSession     = "session"
	PoolModeTransaction = "transaction"
)

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
}

func init() {
	settings = append(settings,
		setting{name: "pool-mode", arg: "MODE", usage: "session: a server connection per client session (default); transaction: clients share pools of server connections, one per (database, user), holding one only during a transaction",
			field: func(c *Config) any { return &c.PoolMode }, check: checkPoolMode},
		setting{name: "pool-size", arg: "N", usage: "most server connections per (database, user) in transaction mode (default 20)",
			field: func(c *Config) any { return &c.PoolSize }, check: checkNotNegative(func(c *Config) int { return c.PoolSize })},
		setting{name: "min-pool-size", arg: "N", usage: "server connections kept open per (database, user) once used, idle or not (default 0)",
			field: func(c *Config) any { return &c.MinPoolSize }, check: checkMinPoolSize},
		setting{name: "server-idle-timeout", usage: "close a pooled server connection idle for longer (default 10m; negative: never)",
			field: func(c *Config) any { return &c.ServerIdleTimeout }},
		setting{name: "server-lifetime", usage: "close a pooled server connection older than this when it is next idle (default 1h; negative: never)",
			field: func(c *Config) any { return &c.ServerLifetime }},
		setting{name: "query-wait-timeout", usage: "how long a transaction waits for a server connection; past it the statement fails with 57014 and the session goes on (default 2m; negative: forever)",
			field: func(c *Config) any { return &c.QueryWaitTimeout }},
		setting{name: "max-db-connections", arg: "N", usage: "most server connections per database across its users; 0: no limit",
			field: func(c *Config) any { return &c.MaxDBConnections }, check: checkNotNegative(func(c *Config) int { return c.MaxDBConnections })},
	)
}

func checkPoolMode(c *Config, bad problem) {
	switch c.PoolMode {
	case "", PoolModeSession:
	case PoolModeTransaction:
		if c.AuthType == "" || c.AuthType == AuthPassthrough {
			bad("transaction needs the proxy to authenticate clients itself, since pooled connections are shared: set auth-type to scram-sha-256, md5 or trust (passthrough relays each client's login to its own server connection)")
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
