// Package config holds the settings of `leafproxy serve` and reads them from a YAML file,
// LEAFPROXY_* environment variables and command-line flags.
//
// Every setting has one name used in all three places: the YAML key `worker-source`, the
// flag `--worker-source` and the variable LEAFPROXY_WORKER_SOURCE. A flag wins over the
// environment, which wins over the file, which wins over the default. Unknown keys and bad
// values are errors that name the key, where its value came from, and what is allowed.
package config

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/internal/metrics"
	"github.com/leafproxy/leafproxy/proxy"
)

// EnvPrefix starts the name of every environment variable the configuration reads.
const EnvPrefix = "LEAFPROXY_"

// DefaultSnowflakeEpoch is the snowflake engine's default epoch, Leaf's (and Twitter's):
// 2010-11-04T01:42:54.657Z.
const DefaultSnowflakeEpoch = snowflake.DefaultEpochMillis

// DefaultUpstream is the address of the PostgreSQL server behind the proxy when none is
// given: the local one on its standard port.
const DefaultUpstream = "127.0.0.1:5432"

// DefaultHTTP is the address of the admin HTTP server when none is given.
const DefaultHTTP = "127.0.0.1:8080"

// Worker-ID sources.
const (
	WorkerStatic    = "static"
	WorkerPostgres  = "postgres"
	WorkerZooKeeper = "zookeeper"
)

// Config is the whole configuration of `leafproxy serve`. Load fills it; the zero value is
// not meant to be used, start from Defaults.
type Config struct {
	Listen          string `yaml:"listen"`
	Upstream        string `yaml:"upstream"`
	UpstreamSSLMode string `yaml:"upstream-sslmode"`
	UpstreamCA      string `yaml:"upstream-ca"`
	TLSCert         string `yaml:"tls-cert"`
	TLSKey          string `yaml:"tls-key"`
	MaxClientConns  int    `yaml:"max-client-conns"`
	MaxMessageSize  int    `yaml:"max-message-size"`
	EventLoops      int    `yaml:"event-loops"`
	IOUring         bool   `yaml:"io-uring"`
	// UpstreamSSL is UpstreamSSLMode parsed; Validate sets it.
	UpstreamSSL proxy.SSLMode `yaml:"-"`
	Pooling     `yaml:",inline"`

	// Authentication at the proxy (auth.go).
	AuthType     string `yaml:"auth-type"`
	AuthFile     string `yaml:"auth-file"`
	AuthUser     string `yaml:"auth-user"`
	AuthQuery    string `yaml:"auth-query"`
	AuthPassword string `yaml:"auth-password"`

	Store          string `yaml:"store"`
	MigrateOnStart bool   `yaml:"migrate-on-start"`

	// Databases routes the database a client names to an upstream (databases.go).
	Databases Databases `yaml:"databases"`
	// Users overrides the pool settings per user (users.go).
	Users Users `yaml:"users"`

	HTTP      string `yaml:"http"`
	HTTPToken string `yaml:"http-token"`
	HTTPPprof bool   `yaml:"http-pprof"`

	WorkerSource   string        `yaml:"worker-source"`
	WorkerID       int           `yaml:"worker-id"`
	WorkerStateDir string        `yaml:"worker-state-dir"`
	WorkerLeaseTTL time.Duration `yaml:"worker-lease-ttl"`
	ZooKeeper      List          `yaml:"zk"`
	ZooKeeperName  string        `yaml:"zk-name"`
	AdvertisedAddr string        `yaml:"advertise"`

	SnowflakeTags  List          `yaml:"snowflake-tags"`
	SnowflakeEpoch int64         `yaml:"snowflake-epoch"`
	MaxBackwards   time.Duration `yaml:"clock-max-backwards"`

	// MaxBatch is the largest n of leaf_next('tag', n) and of the HTTP ?count=n.
	MaxBatch int `yaml:"max-batch"`

	Fill List `yaml:"fill"`
	// FillRules is Fill parsed; Load sets it.
	FillRules []FillRule `yaml:"-"`
	// FillRefresh is how often the fill rules of the store (leaf_fill) are read again.
	FillRefresh time.Duration `yaml:"fill-refresh"`

	SegmentPreload float64 `yaml:"segment-preload"`
	KeyTypes       List    `yaml:"key-types"`
	// TagKeyTypes is KeyTypes parsed; Validate sets it.
	TagKeyTypes map[string]metrics.KeyType `yaml:"-"`

	ShutdownTimeout time.Duration `yaml:"shutdown-timeout"`
	LogLevel        string        `yaml:"log-level"`
	LogFormat       string        `yaml:"log-format"`

	// Origins tells, per setting name, where its value came from ("default",
	// "file leafproxy.yaml:12", "env LEAFPROXY_X", "flag --x"); Load sets it.
	Origins map[string]string `yaml:"-"`
}

// Defaults returns the configuration used where nothing else is said. A default that the
// proxy or an ID engine has of its own is taken from there.
func Defaults() Config {
	return Config{
		Listen:          proxy.DefaultAddr,
		Upstream:        DefaultUpstream,
		UpstreamSSLMode: string(proxy.SSLPrefer),
		Pooling:         Pooling{PoolMode: PoolModeSession, MaxPreparedStatements: DefaultMaxPreparedStatements, SessionReuse: true},
		MaxClientConns:  1000,
		IOUring:         true,
		MaxMessageSize:  proxy.DefaultMaxMessageSize,
		HTTP:            DefaultHTTP,
		AuthType:        AuthPassthrough,
		AuthQuery:       DefaultAuthQuery,
		ZooKeeperName:   "leafproxy",
		SnowflakeEpoch:  DefaultSnowflakeEpoch,
		MaxBackwards:    snowflake.DefaultMaxBackwards,
		SegmentPreload:  segment.DefaultPreloadThreshold,
		MaxBatch:        proxy.DefaultMaxBatch,
		ShutdownTimeout: 30 * time.Second,
		FillRefresh:     60 * time.Second,
		LogLevel:        "info",
		LogFormat:       "text",
	}
}

// IsSet reports whether the setting got its value from a file, the environment or a flag.
func (c *Config) IsSet(name string) bool {
	o, ok := c.Origins[name]
	return ok && o != "default"
}

// List is a list of strings that YAML may give as a sequence or as one comma-separated
// string, and the environment and flags give comma-separated.
type List []string

// UnmarshalYAML accepts `[a, b]`, a block sequence, or "a,b".
func (l *List) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.SequenceNode:
		var items []string
		if err := n.Decode(&items); err != nil {
			return err
		}
		*l = cleanList(items)
		return nil
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			*l = nil
			return nil
		}
		*l = splitList(n.Value)
		return nil
	}
	return fmt.Errorf("want a list or a comma-separated string")
}

func splitList(s string) List { return cleanList(strings.Split(s, ",")) }

func cleanList(items []string) List {
	var out List
	for _, it := range items {
		if it = strings.TrimSpace(it); it != "" {
			out = append(out, it)
		}
	}
	return out
}

// setting describes one configuration value: its name (YAML key and flag), help text, and
// where it lives in Config.
type setting struct {
	name  string
	arg   string // placeholder in help texts; default by type (see FlagArg)
	usage string
	alias string // a second flag name (--database for databases)
	field func(*Config) any
	// repeat: the flag may be given several times; each adds to the list.
	repeat bool
	// check reports what is wrong with the value (nil: any value goes); see validate.go.
	check func(c *Config, bad problem)
}

// EnvName returns the environment variable of a setting name: worker-id → LEAFPROXY_WORKER_ID.
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// settings is every setting, in the order of the help text. Adding one takes a field in
// Config (with its yaml key), a row here (name, usage, field and, when some values are
// wrong, check, a function of validate.go's kind), and its default in Defaults when it
// is not the zero value.
var settings = []setting{
	{name: "listen", arg: "HOST:PORT", usage: "address the PostgreSQL proxy listens on (host:port)",
		field: func(c *Config) any { return &c.Listen },
		check: checkListen},
	{name: "upstream", arg: "HOST:PORT|SOCKET", usage: "address of the real PostgreSQL server: host:port, or the path of a Unix socket",
		field: func(c *Config) any { return &c.Upstream },
		check: checkUpstream},
	{name: "databases", alias: "database", arg: "NAME=CONNSTRING", repeat: true, usage: "route the database NAME clients ask for to an upstream, as a PgBouncer [databases] line: host=H port=P dbname=D (or upstream=HOST:PORT|SOCKET), and pool_mode, pool_size, min_pool_size, max_db_connections, server_lifetime; NAME * serves every other database; repeatable; unset: every database goes to upstream",
		field: func(c *Config) any { return &c.Databases },
		check: checkDatabases},
	{name: "upstream-sslmode", arg: "MODE", usage: "TLS to the upstream: disable, prefer, require or verify-full (libpq's meanings)",
		field: func(c *Config) any { return &c.UpstreamSSLMode },
		check: checkUpstreamSSLMode},
	{name: "upstream-ca", arg: "FILE", usage: "PEM file of CA certificates that verify the upstream under verify-full (default: the system roots)",
		field: func(c *Config) any { return &c.UpstreamCA },
		check: checkUpstreamCA},
	{name: "tls-cert", arg: "FILE", usage: "PEM certificate offered to clients that ask for TLS (with tls-key); unset: clients get no TLS",
		field: func(c *Config) any { return &c.TLSCert },
		check: checkTLSCert},
	{name: "tls-key", arg: "FILE", usage: "PEM private key of tls-cert",
		field: func(c *Config) any { return &c.TLSKey },
		check: checkTLSKey},
	{name: "max-client-conns", usage: "client connections served at once; more are refused with SQLSTATE 53300",
		field: func(c *Config) any { return &c.MaxClientConns },
		check: checkMaxClientConns},
	{name: "max-message-size", arg: "BYTES", usage: "largest protocol message in bytes accepted from either side",
		field: func(c *Config) any { return &c.MaxMessageSize },
		check: checkMaxMessageSize},
	{name: "event-loops", arg: "N", usage: "event loops serving the sessions; 0: one per four processors; -1: a goroutine pair per session instead",
		field: func(c *Config) any { return &c.EventLoops },
		check: checkEventLoops},
	{name: "io-uring", usage: "event loops send the last writes of each turn together, and receive from the sockets a wait reported readable together, each in one system call over io_uring, where the kernel allows it; false: a sendto per write, a recvfrom per read",
		field: func(c *Config) any { return &c.IOUring }},
	{name: "store", arg: "URL", usage: "PostgreSQL URL of the database holding leaf_alloc and leaf_worker_lease (required), e.g. postgres://leaf@127.0.0.1:5432/app",
		field: func(c *Config) any { return &c.Store },
		check: checkStore},
	{name: "migrate-on-start", usage: "apply the embedded migrations to the store before serving",
		field: func(c *Config) any { return &c.MigrateOnStart }},
	{name: "http", arg: "HOST:PORT", usage: "address of the HTTP admin API, status page and metrics (host:port); empty disables it",
		field: func(c *Config) any { return &c.HTTP },
		check: checkHTTP},
	{name: "http-token", arg: "TOKEN", usage: "bearer token required on every HTTP endpoint except /healthz; empty: no token",
		field: func(c *Config) any { return &c.HTTPToken },
		check: checkHTTPToken},
	{name: "http-pprof", usage: "serve Go's profiler under /debug/pprof/ on the admin HTTP server (behind http-token when set)",
		field: func(c *Config) any { return &c.HTTPPprof }},
	{name: "worker-source", arg: "SOURCE", usage: "where the snowflake worker ID comes from: static, postgres or zookeeper (default: zookeeper when zk is set, else postgres)",
		field: func(c *Config) any { return &c.WorkerSource },
		check: checkWorkerSource},
	{name: "worker-id", usage: "snowflake worker ID 0..1023 (worker-source static only)",
		field: func(c *Config) any { return &c.WorkerID },
		check: checkWorkerID},
	{name: "worker-state-dir", arg: "DIR", usage: "directory where worker-source static keeps the worker ID's time high-water mark (worker-{id}.highwater) and lock; use one that survives reboots (default: {TMPDIR}/leafproxy)",
		field: func(c *Config) any { return &c.WorkerStateDir },
		check: checkWorkerStateDir},
	{name: "worker-lease-ttl", usage: "how long a leaf_worker_lease row holds the worker ID without a renewal (worker-source postgres); renewed every third of it (at most 3s); the proxy stops issuing a tenth of it before the row can expire (default 30s)",
		field: func(c *Config) any { return &c.WorkerLeaseTTL },
		check: checkWorkerLeaseTTL},
	{name: "zk", arg: "HOST:PORT,...", usage: "ZooKeeper servers, comma-separated host:port list",
		field: func(c *Config) any { return &c.ZooKeeper },
		check: checkZooKeeper},
	{name: "zk-name", arg: "NAME", usage: "name under /snowflake/ in ZooKeeper (Leaf's leaf.name); also the leaf_worker_lease holder prefix",
		field: func(c *Config) any { return &c.ZooKeeperName },
		check: checkZooKeeperName},
	{name: "advertise", arg: "IP:PORT", usage: "ip:port that identifies this proxy to the worker-ID source (default: the listen port with the listen IP, or with the first non-loopback IPv4 when listening on loopback or all interfaces)",
		field: func(c *Config) any { return &c.AdvertisedAddr },
		check: checkAdvertise},
	{name: "snowflake-tags", arg: "TAG,...", usage: "tags served by the snowflake engine, comma-separated; every other tag is a segment tag",
		field: func(c *Config) any { return &c.SnowflakeTags },
		check: checkSnowflakeTags},
	{name: "snowflake-epoch", arg: "MS", usage: "snowflake epoch in Unix milliseconds",
		field: func(c *Config) any { return &c.SnowflakeEpoch },
		check: checkSnowflakeEpoch},
	{name: "clock-max-backwards", usage: "largest backwards clock step the snowflake engine waits out; more fails the request",
		field: func(c *Config) any { return &c.MaxBackwards },
		check: checkMaxBackwards},
	{name: "max-batch", arg: "N", usage: "largest number of IDs one SELECT leaf_next('tag', n) or HTTP ?count=n hands out",
		field: func(c *Config) any { return &c.MaxBatch },
		check: checkMaxBatch},
	{name: "fill", arg: "[SCHEMA.]TABLE.COLUMN=TAG", repeat: true, usage: "fill rule [schema.]table.column=tag: INSERTs into table without column get an ID of tag (repeatable)",
		field: func(c *Config) any { return &c.Fill },
		check: checkFill},
	{name: "fill-refresh", usage: "how often the fill rules in the store (leaf_fill) are read again; SIGHUP reads them at once",
		field: func(c *Config) any { return &c.FillRefresh },
		check: checkFillRefresh},
	{name: "segment-preload", usage: "load the next segment when less than this fraction of the current one is left (Leaf: 0.9)",
		field: func(c *Config) any { return &c.SegmentPreload },
		check: checkSegmentPreload},
	{name: "key-types", arg: "TAG=TYPE,...", usage: "key column type of segment tags, for their runway (IDs and time left): TYPE is bigint, integer or js (2^53-1); *=TYPE sets it for every tag not named (default bigint)",
		field: func(c *Config) any { return &c.KeyTypes },
		check: checkKeyTypes},
	{name: "shutdown-timeout", usage: "how long a graceful shutdown waits for client sessions to end",
		field: func(c *Config) any { return &c.ShutdownTimeout },
		check: checkShutdownTimeout},
	{name: "log-level", arg: "LEVEL", usage: "log level: trace, debug, info, warn, error",
		field: func(c *Config) any { return &c.LogLevel },
		check: checkLogLevel},
	{name: "log-format", arg: "FORMAT", usage: "log format: text or json",
		field: func(c *Config) any { return &c.LogFormat },
		check: checkLogFormat},
}

// Names returns every setting name in the order of the help text.
func Names() []string {
	out := make([]string, len(settings))
	for i, s := range settings {
		out[i] = s.name
	}
	return out
}

func lookup(name string) (*setting, bool) {
	for i := range settings {
		if settings[i].name == name {
			return &settings[i], true
		}
	}
	return nil, false
}
