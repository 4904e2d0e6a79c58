package config

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// This file holds the databases setting: which upstream serves the database a client
// names. Its entries are written as PgBouncer's [databases] lines, so that such a line
// moves over unchanged:
//
//	databases:
//	  app: host=10.0.0.5 port=5432 dbname=app_prod
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

// Set replaces the setting with the entries of s: NAME=CONNSTRING, separated by ';' or
// new lines (the environment variable gives them all at once).
func (ds *Databases) Set(s string) error {
	*ds = nil
	return ds.add(splitEntries(s))
}

// setFlags replaces the setting with the entries of repeated --database flags, each
// read as Set reads it.
func (ds *Databases) setFlags(vals []string) error {
	*ds = nil
	for _, v := range vals {
		if err := ds.add(splitEntries(v)); err != nil {
			return err
		}
	}
	return nil
}

// splitEntries splits entries separated by ';' or new lines.
func splitEntries(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == '\n' })
}

func (ds *Databases) add(entries []string) error {
	for _, e := range entries {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		name, conn, ok := strings.Cut(e, "=")
		if !ok {
			return fmt.Errorf("%q is not NAME=CONNSTRING (e.g. app=host=10.0.0.5 port=5432 dbname=app_prod)", e)
		}
		kvs, err := parseConnString(conn)
		if err != nil {
			return fmt.Errorf("database %q: %w", strings.TrimSpace(name), err)
		}
		if err := ds.addEntry(strings.TrimSpace(name), kvs); err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalYAML reads a mapping of database names to a PgBouncer connection string or to
// a mapping of the same keys.
func (ds *Databases) UnmarshalYAML(n *yaml.Node) error {
	*ds = nil
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return errors.New("want a mapping of database names to connection strings (app: host=10.0.0.5 dbname=app_prod)")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var kvs []connParam
		switch v.Kind {
		case yaml.ScalarNode:
			var err error
			if kvs, err = parseConnString(v.Value); err != nil {
				return fmt.Errorf("line %d: database %q: %w", k.Line, k.Value, err)
			}
		case yaml.MappingNode:
			for j := 0; j+1 < len(v.Content); j += 2 {
				pk, pv := v.Content[j], v.Content[j+1]
				if pv.Kind != yaml.ScalarNode {
					return fmt.Errorf("line %d: database %q: %s: want a single value", pk.Line, k.Value, pk.Value)
				}
				kvs = append(kvs, connParam{pk.Value, pv.Value})
			}
		default:
			return fmt.Errorf("line %d: database %q: want a connection string or a mapping", k.Line, k.Value)
		}
		if err := ds.addEntry(k.Value, kvs); err != nil {
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
	"user":                      "the proxy relays the client's own login, so the client logs in as itself",
	"password":                  "the proxy relays the client's own login and stores no password",
	"auth_user":                 "the proxy relays the client's own login",
	"auth_dbname":               "the proxy relays the client's own login",
	"auth_query":                "the proxy relays the client's own login",
	"pool_mode":                 "pooling is not supported yet: every client holds its own server connection (session mode)",
	"pool_size":                 "pooling is not supported yet: every client holds its own server connection (session mode)",
	"min_pool_size":             "pooling is not supported yet",
	"reserve_pool":              "pooling is not supported yet",
	"reserve_pool_size":         "pooling is not supported yet",
	"max_db_connections":        "pooling is not supported yet; max-client-conns bounds all sessions",
	"max_db_client_connections": "pooling is not supported yet; max-client-conns bounds all sessions",
	"server_lifetime":           "pooling is not supported yet",
	"connect_query":             "not supported",
	"client_encoding":           "not supported: the client sets its own",
	"datestyle":                 "not supported: the client sets its own",
	"timezone":                  "not supported: the client sets its own",
	"application_name":          "not supported: the client sets its own",
	"load_balance_hosts":        "not supported: give one host",
}

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
		default:
			if why, ok := notYet[kv.key]; ok {
				return fmt.Errorf("database %q: key %q is not supported yet: %s", name, kv.key, why)
			}
			msg := fmt.Sprintf("database %q: unknown key %q (want host, port, dbname or upstream)", name, kv.key)
			if near := Nearest(kv.key, []string{"host", "port", "dbname", "upstream"}); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			return errors.New(msg)
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

// checkDatabases checks the addresses of the databases setting; Validate calls it.
func checkDatabases(c *Config, bad problem) {
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
