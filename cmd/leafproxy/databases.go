package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/proxy"
	"github.com/leafproxy/leafproxy/proxy/pool"
	"github.com/leafproxy/leafproxy/rewrite"
)

// This file routes the databases clients name to their upstreams (the databases setting,
// with upstream as the fallback when it is unset), with the pool mode and sizes of each
// database and user, and applies a changed map on SIGHUP: the configuration is read again
// (file, environment and the flags given at start), and when it is valid its databases,
// upstream, users and pool modes become the routing table of new sessions, and its pool
// sizes and timeouts apply to the running pools. Sessions in progress keep their
// upstream and their mode. Other changed settings need a restart; a reload says which.

// databaseRoutes is the routing the proxy uses and how to read it again.
type databaseRoutes struct {
	// load reads the configuration again; nil: reload is not possible.
	load func() (*config.Config, error)

	mu  sync.Mutex
	cfg *config.Config // the configuration of the last reload; nil: app.cfg
}

// routingConfig returns the configuration of the routes in use: the one read last by a
// reload, else the one serve started with.
func (a *app) routingConfig() *config.Config {
	a.dbs.mu.Lock()
	defer a.dbs.mu.Unlock()
	if a.dbs.cfg != nil {
		return a.dbs.cfg
	}
	return a.cfg
}

// routesOf builds the proxy's routing table: each entry of databases, the "*" one as
// the fallback; an entry without an address goes to upstream. Without databases, every
// database goes to upstream. Each route carries its pool mode (the entry's, else
// pool-mode) and pool sizes, and the table the users' overrides, so that a reload
// applies them all at once.
func routesOf(cfg *config.Config) *proxy.Routes {
	users := make(map[string]proxy.UserPooling, len(cfg.Users))
	for _, u := range cfg.Users {
		users[u.Name] = proxy.UserPooling{PoolMode: proxy.PoolMode(u.PoolMode), Pool: pool.Limits{PoolSize: u.PoolSize}}
	}
	if len(cfg.Databases) == 0 {
		return proxy.NewRoutes(nil, &proxy.Route{Upstream: cfg.Upstream, PoolMode: proxy.PoolMode(cfg.PoolMode)}).WithUsers(users)
	}
	named := map[string]proxy.Route{}
	var fallback *proxy.Route
	for _, d := range cfg.Databases {
		rt := proxy.Route{
			Upstream:         d.Upstream,
			Database:         d.DBName,
			PoolMode:         proxy.PoolMode(cmp.Or(d.PoolMode, cfg.PoolMode)),
			Pool:             pool.Limits{PoolSize: d.PoolSize, MinPoolSize: d.MinPoolSize, ServerLifetime: d.ServerLifetime},
			MaxDBConnections: d.MaxDBConnections,
		}
		if rt.Upstream == "" {
			rt.Upstream = cfg.Upstream
		}
		if d.Name == config.FallbackDatabase {
			fallback = &rt
			continue
		}
		named[d.Name] = rt
	}
	return proxy.NewRoutes(named, fallback).WithUsers(users)
}

// upstreamTarget names every upstream address, for the health probe and the status page.
func upstreamTarget(cfg *config.Config) string {
	addrs := cfg.UpstreamAddrs()
	out := make([]string, 0, len(addrs))
	for addr := range addrs {
		out = append(out, addr)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// checkUpstreams dials every upstream of the routes in use (see health.DialPostgres) and,
// when there are several, names each one that does not answer with the databases it
// serves.
func (a *app) checkUpstreams(ctx context.Context) error {
	addrs := a.routingConfig().UpstreamAddrs()
	if len(addrs) == 1 {
		for addr := range addrs {
			return health.DialPostgres(ctx, addr) // the target names it already
		}
	}
	var (
		mu       sync.Mutex
		problems []string
		wg       sync.WaitGroup
	)
	for addr, names := range addrs {
		wg.Go(func() {
			if err := health.DialPostgres(ctx, addr); err != nil {
				mu.Lock()
				defer mu.Unlock()
				problems = append(problems, fmt.Sprintf("%s (database %s): %v", addr, strings.Join(names, ", "), err))
			}
		})
	}
	wg.Wait()
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	return errors.New(strings.Join(problems, "; "))
}

// reloadDatabases reads the configuration again and applies its databases and upstream
// when it is valid; otherwise the routes in use stay. The SIGHUP watcher (watchFill)
// calls it.
func (a *app) reloadDatabases() {
	if a.dbs.load == nil {
		return
	}
	cfg, err := a.dbs.load()
	if err != nil {
		a.log.WithError(err).Error("configuration not reloaded: keeping the databases in use")
		return
	}
	if cfg.UsesTransactionMode() && a.cfg.AuthType == config.AuthPassthrough {
		// Transaction mode needs the proxy to authenticate clients, and auth-type needs
		// a restart: the running passthrough cannot serve it.
		a.log.WithFields(logrus.Fields{"auth_type": a.cfg.AuthType, "new_auth_type": cfg.AuthType}).Error(
			"configuration not reloaded: keeping the databases in use; transaction mode with a new auth-type needs a restart")
		return
	}
	old := a.routingConfig()
	a.dbs.mu.Lock()
	a.dbs.cfg = cfg
	a.dbs.mu.Unlock()
	a.refreshCatalogDatabases(cfg)
	a.proxy.SetRoutes(routesOf(cfg))
	a.reloadPooling(cfg)
	a.upstreamProbe.SetTarget(upstreamTarget(cfg))
	fields := logrus.Fields{"databases": cfg.Databases.String(), "upstream": cfg.Upstream, "users": cfg.Users.String(), "pool_mode": cfg.PoolMode}
	if ignored := changedSettings(old, cfg); len(ignored) > 0 {
		fields["not_applied"] = strings.Join(ignored, ",")
		a.log.WithFields(fields).Warn("databases reloaded for new sessions; the other changed settings need a restart")
		return
	}
	a.log.WithFields(fields).Info("databases reloaded for new sessions")
}

// changedSettings names the settings that differ and that a reload does not apply: all
// but databases, upstream and the pool settings.
func changedSettings(old, cfg *config.Config) []string {
	a, b := *old, *cfg
	var out []string
	for _, name := range config.Names() {
		if name == "databases" || name == "upstream" || poolReloadable[name] {
			continue
		}
		if !reflect.DeepEqual(fieldOf(&a, name), fieldOf(&b, name)) {
			out = append(out, name)
		}
	}
	return out
}

// fieldOf is the value of a setting by its YAML key.
func fieldOf(c *config.Config, name string) any { return fieldByTag(reflect.ValueOf(c).Elem(), name) }

// fieldByTag finds the field of a YAML key in v, looking into inlined structs.
func fieldByTag(v reflect.Value, name string) any {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		switch tag := t.Field(i).Tag.Get("yaml"); {
		case tag == name:
			return v.Field(i).Interface()
		case tag == ",inline":
			if f := fieldByTag(v.Field(i), name); f != nil {
				return f
			}
		}
	}
	return nil
}

// reloadFrom returns how serve reads its configuration again: with the flags it was
// started with and the environment of the process.
func reloadFrom(flags *config.Flags) func() (*config.Config, error) {
	return func() (*config.Config, error) { return config.Load(flags, os.LookupEnv) }
}

// catalogDB is a database the catalog of the filled tables is read from, besides the
// store's database at the upstream.
type catalogDB struct {
	addr string // as configured, for messages
	host string // host name, or the directory of a Unix socket
	port uint16
	name string
}

// catalogDatabases lists the databases of cfg's databases setting whose name is known:
// the dbname of an entry, else its own name. Databases reached through "*" with the name
// the client asked for cannot be listed: they share the catalog of the store's database.
func catalogDatabases(cfg *config.Config) []catalogDB {
	var out []catalogDB
	seen := map[string]bool{}
	for _, d := range cfg.Databases {
		name := d.DBName
		if name == "" && d.Name != config.FallbackDatabase {
			name = d.Name
		}
		addr := d.Upstream
		if addr == "" {
			addr = cfg.Upstream
		}
		if name == "" || seen[addr+"\x00"+name] {
			continue
		}
		seen[addr+"\x00"+name] = true
		host, port, err := splitUpstream(addr)
		if err != nil {
			continue // validated by config: not reached
		}
		out = append(out, catalogDB{addr: addr, host: host, port: port, name: name})
	}
	return out
}

// splitUpstream turns an upstream address into pgx's host and port: a Unix socket path
// /dir/.s.PGSQL.5432 becomes the directory and the port, as libpq spells it.
func splitUpstream(addr string) (string, uint16, error) {
	if strings.HasPrefix(addr, "/") {
		dir, file := filepath.Split(addr)
		p, err := strconv.ParseUint(strings.TrimPrefix(file, ".s.PGSQL."), 10, 16)
		if err != nil || !strings.HasPrefix(file, ".s.PGSQL.") {
			return "", 0, fmt.Errorf("socket %s is not named .s.PGSQL.PORT", addr)
		}
		return filepath.Clean(dir), uint16(p), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", port, err)
	}
	return host, uint16(p), nil
}

// setDatabases makes the next load read the filled tables of dbs as well.
func (c *catalog) setDatabases(dbs []catalogDB) {
	c.mu.Lock()
	c.dbs = dbs
	c.mu.Unlock()
}

// mergeCatalog adds the tables of other to snap. A table whose columns or types differ
// from snap's is removed from snap and named in differ, which it returns; a table named
// in differ stays out.
func mergeCatalog(snap, other map[tableName]rewrite.Table, differ []tableName) []tableName {
	for k, t := range other {
		if slices.Contains(differ, k) {
			continue
		}
		have, ok := snap[k]
		switch {
		case !ok:
			snap[k] = t
		case !reflect.DeepEqual(have, t):
			delete(snap, k)
			differ = append(differ, k)
		}
	}
	slices.SortFunc(differ, func(a, b tableName) int { return strings.Compare(a.String(), b.String()) })
	return differ
}

// warnDiffering logs the filled tables the catalog left out because their columns differ
// between databases, and the unqualified names left out because their tables' columns
// differ between schemas.
func (a *app) warnDiffering(cat *catalog) {
	cat.mu.Lock()
	differ, ambiguous := cat.differ, cat.ambiguous
	cat.mu.Unlock()
	if len(differ) > 0 {
		names := make([]string, len(differ))
		for i, n := range differ {
			names[i] = n.String()
		}
		a.log.WithField("tables", strings.Join(names, ",")).Warn("filled tables whose columns differ between databases: an INSERT without a column list into them is refused (0A000); name the columns")
	}
	if len(ambiguous) > 0 {
		a.log.WithField("tables", strings.Join(ambiguous, ",")).Warn("filled tables whose columns differ between schemas: an INSERT without a column list that names one without its schema is refused (0A000), since the search_path decides which it reaches; name the columns or the schema")
	}
}

// refreshCatalogDatabases points the catalog at the databases of cfg and reads it again,
// so that the sessions routed by a reloaded map are planned with their tables' columns.
func (a *app) refreshCatalogDatabases(cfg *config.Config) {
	cat := a.catalogNow()
	if cat == nil {
		return
	}
	cat.setDatabases(catalogDatabases(cfg))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	changed, err := cat.load(ctx)
	switch {
	case err != nil:
		a.log.WithError(err).Warn("cannot read the columns of the filled tables; retrying at the next refresh")
	case changed:
		a.rewriterNow().CatalogChanged()
	}
	a.warnDiffering(cat)
}
