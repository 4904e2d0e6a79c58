package config

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// This file holds the databases setting: which upstream serves the database a client
// names. Its entries are written as PgBouncer's [databases] lines, so that such a line
// moves over unchanged:
//
//	databases:
//	  app: host=10.0.0.5 port=5432 dbname=app_prod pool_mode=transaction pool_size=30
//	  reports: {upstream: /var/run/postgresql/.s.PGSQL.5433}
//	  "*": host=127.0.0.1
//
// and as flags --database 'app=host=10.0.0.5 port=5432 dbname=app_prod' (repeatable), or
// LEAFPROXY_DATABASES with entries separated by ';'.

// FallbackDatabase is the name of the entry that serves every database not named.
const FallbackDatabase = "*"

// DefaultPort is PostgreSQL's port, the port of a database entry that names none.
const DefaultPort = 5432

// Database is one entry of the databases setting.
type Database struct {
	// Name is the database a client asks for in its startup packet, or "*".
	Name string
	// Upstream is the server's address: host:port, or the path of a Unix socket (as
	// the upstream setting). Empty: the upstream setting.
	Upstream string
	// DBName is the database the upstream is asked for; empty: the name the client
	// asked for.
	DBName string
	// PoolMode is pool_mode, the pool mode of the database's sessions; empty: the
	// pool-mode setting.
	PoolMode string
	// PoolSize, MinPoolSize and MaxDBConnections are the database's pool_size,
	// min_pool_size and max_db_connections; 0: the global setting.
	PoolSize, MinPoolSize, MaxDBConnections int
	// ServerLifetime is the database's server_lifetime; 0: the global setting,
	// negative: never.
	ServerLifetime time.Duration
}

// String renders the entry as the flag that gives it.
func (d Database) String() string {
	var parts []string
	if d.Upstream != "" {
		parts = append(parts, "upstream="+quoteConnValue(d.Upstream))
	}
	if d.DBName != "" {
		parts = append(parts, "dbname="+quoteConnValue(d.DBName))
	}
	parts = appendPoolKeys(parts, d.PoolMode, []namedInt{
		{"pool_size", d.PoolSize}, {"min_pool_size", d.MinPoolSize}, {"max_db_connections", d.MaxDBConnections}})
	if d.ServerLifetime != 0 {
		parts = append(parts, "server_lifetime="+d.ServerLifetime.String())
	}
	return d.Name + "=" + strings.Join(parts, " ")
}

// Databases is the value of the databases setting, in the order given.
type Databases []Database

// Lookup returns the entry of name, else the "*" entry; false when neither exists.
func (ds Databases) Lookup(name string) (Database, bool) {
	var fallback *Database
	for i := range ds {
		switch ds[i].Name {
		case name:
			return ds[i], true
		case FallbackDatabase:
			fallback = &ds[i]
		}
	}
	if fallback != nil {
		return *fallback, true
	}
	return Database{}, false
}

// String renders the setting as LEAFPROXY_DATABASES would give it.
func (ds Databases) String() string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	return strings.Join(parts, "; ")
}

// databaseExample is an entry of the databases setting, for messages.
const databaseExample = "app=host=10.0.0.5 port=5432 dbname=app_prod"

// Set replaces the setting with the entries of s: NAME=CONNSTRING, separated by ';' or
// new lines (the environment variable gives them all at once).
func (ds *Databases) Set(s string) error {
	*ds = nil
	return addEntries(splitEntries(s), "database", databaseExample, ds.addEntry)
}

// setFlags replaces the setting with the entries of repeated --database flags, each
// read as Set reads it.
func (ds *Databases) setFlags(vals []string) error {
	*ds = nil
	for _, v := range vals {
		if err := addEntries(splitEntries(v), "database", databaseExample, ds.addEntry); err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalYAML reads a mapping of database names to a PgBouncer connection string or to
// a mapping of the same keys.
func (ds *Databases) UnmarshalYAML(n *yaml.Node) error {
	*ds = nil
	return unmarshalEntries(n, "database", "app: host=10.0.0.5 dbname=app_prod", ds.addEntry)
}

// splitEntries splits entries separated by ';' or new lines.
func splitEntries(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == '\n' })
}

// addEntries reads entries NAME=KEY=VALUE KEY=VALUE… (the databases and users settings)
// and hands each to add; what names the kind of entry and example shows one, for the
// messages.
func addEntries(entries []string, what, example string, add func(name string, kvs []connParam) error) error {
	for _, e := range entries {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		name, conn, ok := strings.Cut(e, "=")
		if !ok {
			return fmt.Errorf("%q is not NAME=KEY=VALUE… (e.g. %s)", e, example)
		}
		kvs, err := parseConnString(conn)
		if err != nil {
			return fmt.Errorf("%s %q: %w", what, strings.TrimSpace(name), err)
		}
		if err := add(strings.TrimSpace(name), kvs); err != nil {
			return err
		}
	}
	return nil
}

// unmarshalEntries reads a YAML mapping of names to a string of key=value pairs or to a
// mapping of the same keys, and hands each entry to add; what names the kind of entry
// and example shows one, for the messages.
func unmarshalEntries(n *yaml.Node, what, example string, add func(name string, kvs []connParam) error) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("want a mapping of %s names to key=value strings (%s)", what, example)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var kvs []connParam
		switch v.Kind {
		case yaml.ScalarNode:
			var err error
			if kvs, err = parseConnString(v.Value); err != nil {
				return fmt.Errorf("line %d: %s %q: %w", k.Line, what, k.Value, err)
			}
		case yaml.MappingNode:
			for j := 0; j+1 < len(v.Content); j += 2 {
				pk, pv := v.Content[j], v.Content[j+1]
				if pv.Kind != yaml.ScalarNode {
					return fmt.Errorf("line %d: %s %q: %s: want a single value", pk.Line, what, k.Value, pk.Value)
				}
				kvs = append(kvs, connParam{pk.Value, pv.Value})
			}
		default:
			return fmt.Errorf("line %d: %s %q: want a key=value string or a mapping", k.Line, what, k.Value)
		}
		if err := add(k.Value, kvs); err != nil {
			return fmt.Errorf("line %d: %w", k.Line, err)
		}
	}
	return nil
}

// connParam is one key=value of a connection string.
type connParam struct{ key, value string }

// notYet names the PgBouncer database keys leafproxy knows but does not support (yet),
// with why.
var notYet = map[string]string{
	"user":                      "the pool logs in as the client's own user, so the client logs in as itself",
	"password":                  "the proxy stores no password: it logs in with what the client proved (see auth-type)",
	"auth_user":                 "auth-user is one setting for every database",
	"auth_dbname":               "auth-query runs in the database the client asks for",
	"auth_query":                "auth-query is one setting for every database",
	"reserve_pool":              "there is no reserve pool: raise pool_size",
	"reserve_pool_size":         "there is no reserve pool: raise pool_size",
	"max_db_client_connections": "max-client-conns bounds all sessions",
	"connect_query":             "not supported",
	"client_encoding":           "not supported: the client sets its own",
	"datestyle":                 "not supported: the client sets its own",
	"timezone":                  "not supported: the client sets its own",
	"application_name":          "not supported: the client sets its own",
	"load_balance_hosts":        "not supported: give one host",
}

// databaseKeys are the keys of a databases entry, for messages.
var databaseKeys = []string{"host", "port", "dbname", "upstream", "pool_mode", "pool_size", "min_pool_size", "max_db_connections", "server_lifetime"}

// addEntry checks the keys of one entry and appends it.
func (ds *Databases) addEntry(name string, kvs []connParam) error {
	if name == "" {
		return errors.New("a database entry has an empty name")
	}
	if strings.ContainsRune(name, 0) {
		return fmt.Errorf("database %q: the name contains a NUL byte", name)
	}
	for _, d := range *ds {
		if d.Name == name {
			return fmt.Errorf("database %q is given twice", name)
		}
	}
	d := Database{Name: name}
	var host, port string
	seen := map[string]bool{}
	for _, kv := range kvs {
		if seen[kv.key] {
			return fmt.Errorf("database %q: key %q given twice", name, kv.key)
		}
		seen[kv.key] = true
		switch kv.key {
		case "host":
			host = kv.value
		case "port":
			port = kv.value
		case "dbname":
			d.DBName = kv.value
		case "upstream":
			d.Upstream = kv.value
		case "pool_mode":
			if err := parsePoolMode(kv.value, &d.PoolMode); err != nil {
				return fmt.Errorf("database %q: %w", name, err)
			}
		case "pool_size", "min_pool_size", "max_db_connections":
			n, err := parsePoolNumber(kv.key, kv.value)
			if err != nil {
				return fmt.Errorf("database %q: %w", name, err)
			}
			switch kv.key {
			case "pool_size":
				d.PoolSize = n
			case "min_pool_size":
				d.MinPoolSize = n
			default:
				d.MaxDBConnections = n
			}
		case "server_lifetime":
			lt, err := parseLifetime(kv.value)
			if err != nil {
				return fmt.Errorf("database %q: %w", name, err)
			}
			d.ServerLifetime = lt
		default:
			if why, ok := notYet[kv.key]; ok {
				return fmt.Errorf("database %q: key %q is not supported: %s", name, kv.key, why)
			}
			return unknownKey("database", name, kv.key, databaseKeys)
		}
	}
	if (seen["dbname"] && d.DBName == "") || strings.ContainsRune(d.DBName, 0) {
		return fmt.Errorf("database %q: dbname %q must be a non-empty name", name, d.DBName)
	}
	switch {
	case seen["upstream"] && (seen["host"] || seen["port"]):
		return fmt.Errorf("database %q: give upstream or host and port, not both", name)
	case seen["upstream"]:
		if d.Upstream == "" {
			return fmt.Errorf("database %q: upstream is empty", name)
		}
	case seen["host"]:
		addr, err := hostPortAddr(host, port)
		if err != nil {
			return fmt.Errorf("database %q: %w", name, err)
		}
		d.Upstream = addr
	case seen["port"]:
		return fmt.Errorf("database %q: port without host", name)
	}
	*ds = append(*ds, d)
	return nil
}

// hostPortAddr turns libpq's host and port into an upstream address: a host that is a
// path is the directory of the server's Unix socket, as in libpq and PgBouncer.
func hostPortAddr(host, port string) (string, error) {
	if host == "" {
		return "", errors.New("host is empty")
	}
	p := DefaultPort
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q is not a port number (1..65535)", port)
		}
		p = n
	}
	if strings.HasPrefix(host, "/") {
		return path.Join(host, ".s.PGSQL."+strconv.Itoa(p)), nil
	}
	if strings.ContainsAny(host, ",/ ") {
		return "", fmt.Errorf("host %q is not one host name or address", host)
	}
	return joinHostPort(host, p), nil
}

func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// parseConnString splits a libpq keyword/value connection string: key=value pairs
// separated by white space, a value in single quotes may hold spaces, and a backslash
// escapes the next character.
func parseConnString(s string) ([]connParam, error) {
	var out []connParam
	i := 0
	for {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[start:i]
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) || s[i] != '=' {
			return nil, fmt.Errorf("%q has no value (want key=value)", key)
		}
		i++
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		var val strings.Builder
		quoted := i < len(s) && s[i] == '\''
		if quoted {
			i++
		}
		closed := false
		for i < len(s) {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				val.WriteByte(s[i+1])
				i += 2
				continue
			}
			if quoted && c == '\'' {
				i++
				closed = true
				break
			}
			if !quoted && isSpace(c) {
				break
			}
			val.WriteByte(c)
			i++
		}
		if quoted && !closed {
			return nil, fmt.Errorf("the value of %q lacks its closing quote", key)
		}
		out = append(out, connParam{key, val.String()})
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func quoteConnValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r'\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// checkDatabases checks the addresses and the pool keys of the databases setting;
// Validate calls it.
func checkDatabases(c *Config, bad problem) {
	checkDatabasePools(c, bad)
	for _, d := range c.Databases {
		if d.Upstream == "" || strings.HasPrefix(d.Upstream, "/") {
			continue
		}
		if err := checkHostPort(d.Upstream); err != nil {
			bad("database %q: upstream %v", d.Name, err)
		}
	}
}

// UpstreamAddrs returns every distinct upstream address clients may be sent to, sorted,
// each with the database names it serves.
func (c *Config) UpstreamAddrs() map[string][]string {
	out := map[string][]string{}
	fallback := len(c.Databases) == 0
	for _, d := range c.Databases {
		addr := d.Upstream
		if addr == "" {
			addr = c.Upstream
		}
		out[addr] = append(out[addr], d.Name)
	}
	if fallback {
		out[c.Upstream] = []string{FallbackDatabase}
	}
	for _, names := range out {
		sort.Strings(names)
	}
	return out
}
