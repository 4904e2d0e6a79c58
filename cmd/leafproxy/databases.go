package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/health"
	"github.com/leafproxy/leafproxy/proxy"
)

// This file routes the databases clients name to their upstreams (the databases setting,
// with upstream as the fallback when it is unset), and applies a changed map on SIGHUP:
// the configuration is read again (file, environment and the flags given at start), and
// when it is valid its databases and upstream become the routing table of new sessions.
// Sessions in progress keep their upstream. Other changed settings need a restart; a
// reload says which.

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
// database goes to upstream.
func routesOf(cfg *config.Config) *proxy.Routes {
	if len(cfg.Databases) == 0 {
		return proxy.NewRoutes(nil, &proxy.Route{Upstream: cfg.Upstream})
	}
	named := map[string]proxy.Route{}
	var fallback *proxy.Route
	for _, d := range cfg.Databases {
		rt := proxy.Route{Upstream: d.Upstream, Database: d.DBName}
		if rt.Upstream == "" {
			rt.Upstream = cfg.Upstream
		}
		if d.Name == config.FallbackDatabase {
			fallback = &rt
			continue
		}
		named[d.Name] = rt
	}
	return proxy.NewRoutes(named, fallback)
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

// checkUpstreams dials every upstream of the routes in use (see health.DialPostgres) and
// names each one that does not answer with the databases it serves.
func (a *app) checkUpstreams(ctx context.Context) error {
	addrs := a.routingConfig().UpstreamAddrs()
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

// startDatabaseReload applies the routing table of the configuration and, from now on,
// reads the configuration again on every SIGHUP until ctx ends.
func (a *app) startDatabaseReload(ctx context.Context, wg *sync.WaitGroup) {
	a.proxy.SetRoutes(routesOf(a.routingConfig()))
	hup, stop := notifyHangup()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.reloadDatabases()
			}
		}
	}()
}

// reloadDatabases reads the configuration again and applies its databases and upstream
// when it is valid; otherwise the routes in use stay.
func (a *app) reloadDatabases() {
	if a.dbs.load == nil {
		return
	}
	cfg, err := a.dbs.load()
	if err != nil {
		a.log.WithError(err).Error("configuration not reloaded: keeping the databases in use")
		return
	}
	old := a.routingConfig()
	a.dbs.mu.Lock()
	a.dbs.cfg = cfg
	a.dbs.mu.Unlock()
	a.proxy.SetRoutes(routesOf(cfg))
	a.upstreamProbe.SetTarget(upstreamTarget(cfg))
	fields := logrus.Fields{"databases": cfg.Databases.String(), "upstream": cfg.Upstream}
	if ignored := changedSettings(old, cfg); len(ignored) > 0 {
		fields["not_applied"] = strings.Join(ignored, ",")
		a.log.WithFields(fields).Warn("databases reloaded for new sessions; the other changed settings need a restart")
		return
	}
	a.log.WithFields(fields).Info("databases reloaded for new sessions")
}

// changedSettings names the settings other than databases and upstream that differ.
func changedSettings(old, cfg *config.Config) []string {
	a, b := *old, *cfg
	var out []string
	for _, name := range config.Names() {
		if name == "databases" || name == "upstream" {
			continue
		}
		if !reflect.DeepEqual(fieldOf(&a, name), fieldOf(&b, name)) {
			out = append(out, name)
		}
	}
	return out
}

// fieldOf is the value of a setting by its YAML key.
func fieldOf(c *config.Config, name string) any {
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if t.Field(i).Tag.Get("yaml") == name {
			return v.Field(i).Interface()
		}
	}
	return nil
}

// reloadFrom returns how serve reads its configuration again: with the flags it was
// started with and the environment of the process.
func reloadFrom(flags *config.Flags) func() (*config.Config, error) {
	return func() (*config.Config, error) { return config.Load(flags, os.LookupEnv) }
}
