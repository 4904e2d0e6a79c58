package main

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/rewrite"
)

// catalogRefresh is how often the proxy rereads the columns of the filled tables, the
// interval of the segment tag refresh.
const catalogRefresh = 60 * time.Second

// tableName is a schema-qualified table name as the catalog spells it; schema "" is the
// entry of the unqualified name (see unqualified).
type tableName struct{ schema, table string }

func (n tableName) String() string {
	if n.schema == "" {
		return n.table
	}
	return n.schema + "." + n.table
}

// catalog is the rewriter's view of the filled tables' columns: read from the upstream's
// pg_attribute (attnum order, dropped columns left out) with the store's credentials and
// database, and replaced as a whole on each refresh. It is safe for concurrent use.
//
// One rewriter serves the sessions of every database, so with a databases setting the
// catalog is read from each database it names as well (see catalogDatabases), and a
// table whose columns differ between them is left out: an INSERT without a column list
// into it is refused (0A000) rather than planned by another database's column order.
//
// Which table an unqualified name reaches depends on the session's search_path, which
// the proxy does not follow. So an unqualified name gets the columns its table has in
// every schema (and database) that holds one, and no entry when they differ: an INSERT
// without a column list into it is then refused too (see unqualified). A rule that
// names a schema fills an unqualified name only when no other schema holds a table of
// that name; the catalog therefore also lists, for each filled table's name, every
// schema that holds one (see Schemas).
type catalog struct {
	conn *pgx.ConnConfig // the store's settings at the upstream's address
	snap atomic.Pointer[catalogSnap]

	mu    sync.Mutex
	rules []config.FillRule // the rules whose tables are read; setRules replaces them
	dbs   []catalogDB       // further databases read; setDatabases replaces them
	// differ names the tables left out at the last load because their columns differ
	// between databases; ambiguous the unqualified names left out because their columns
	// differ between schemas.
	differ    []tableName
	ambiguous []string
}

// newCatalog returns a catalog of the tables rules fill, empty until the first load.
// setRules changes the rules when the rule set changes.
func newCatalog(store, upstream string, rules []config.FillRule) (*catalog, error) {
	cc, err := pgx.ParseConfig(store)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	host, port, err := splitUpstream(upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	cc.Host, cc.Port, cc.Fallbacks = host, port, nil
	cc.ConnectTimeout = 10 * time.Second
	cc.RuntimeParams["application_name"] = "leafproxy catalog"
	c := &catalog{conn: cc, rules: rules}
	c.snap.Store(&catalogSnap{tables: map[tableName]rewrite.Table{}, schemas: map[string][]string{}})
	return c, nil
}

// catalogSnap is one reading of the catalog, replaced as a whole.
type catalogSnap struct {
	tables map[tableName]rewrite.Table
	// schemas lists, for the name of each table a rule fills, the schemas that hold a
	// table of that name in any database read, filled or not, sorted. Temporary schemas
	// are left out: another session's temporary table must not make the name ambiguous
	// for every session (a session's own is a limitation the README states).
	schemas map[string][]string
}

// setRules makes the next load read the tables of rules.
func (c *catalog) setRules(rules []config.FillRule) {
	c.mu.Lock()
	c.rules = rules
	c.mu.Unlock()
}

// Table implements rewrite.Catalog: schema "" asks for an unqualified name.
func (c *catalog) Table(schema, table string) (rewrite.Table, bool) {
	t, ok := c.snap.Load().tables[tableName{schema, table}]
	return t, ok
}

// Schemas implements rewrite.Catalog.
func (c *catalog) Schemas(table string) []string {
	return c.snap.Load().schemas[table]
}

// catalogQuery lists the columns of the tables named $1 in every schema, in attnum order.
const catalogQuery = `SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = ANY($1) AND c.relkind IN ('r', 'p', 'v', 'f')
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY n.nspname, c.relname, a.attnum`

// load reads the columns of the filled tables and reports whether they differ from what
// the catalog held.
func (c *catalog) load(ctx context.Context) (changed bool, err error) {
	c.mu.Lock()
	rules, dbs := c.rules, c.dbs
	c.mu.Unlock()
	snap, schemas, err := c.read(ctx, c.conn.Copy(), rules)
	if err != nil {
		return false, err
	}
	var differ []tableName
	for _, db := range dbs {
		cc := c.conn.Copy()
		cc.Host, cc.Port, cc.Database = db.host, db.port, db.name
		other, otherSchemas, err := c.read(ctx, cc, rules)
		if err != nil {
			return false, fmt.Errorf("database %s at %s: %w", db.name, db.addr, err)
		}
		differ = mergeCatalog(snap, other, differ)
		for name, list := range otherSchemas {
			schemas[name] = slices.Compact(slices.Sorted(slices.Values(append(schemas[name], list...))))
		}
	}
	ambiguous := unqualified(snap, rules, differ)
	c.mu.Lock()
	c.differ, c.ambiguous = differ, ambiguous
	c.mu.Unlock()
	next := &catalogSnap{tables: snap, schemas: schemas}
	changed = !reflect.DeepEqual(c.snap.Load(), next)
	c.snap.Store(next)
	return changed, nil
}

// read reads the columns of the tables rules fill from the database cc connects to, and
// the schemas that hold a table of each filled table's name (see catalogSnap).
func (c *catalog) read(ctx context.Context, cc *pgx.ConnConfig, rules []config.FillRule) (map[tableName]rewrite.Table, map[string][]string, error) {
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, nil, fmt.Errorf("catalog: %w", err)
	}
	defer conn.Close(context.Background())
	var names []string
	for _, r := range rules {
		names = append(names, r.Table)
	}
	rows, err := conn.Query(ctx, catalogQuery, names)
	if err != nil {
		return nil, nil, fmt.Errorf("catalog: %w", err)
	}
	snap := map[tableName]rewrite.Table{}
	schemas := map[string][]string{}
	var schema, table, column, typ string
	_, err = pgx.ForEachRow(rows, []any{&schema, &table, &column, &typ}, func() error {
		// Rows come by schema, then table: a name's schemas come in order.
		if list := schemas[table]; !temporarySchema(schema) && (len(list) == 0 || list[len(list)-1] != schema) {
			schemas[table] = append(list, schema)
		}
		if !filled(rules, schema, table) {
			return nil
		}
		k := tableName{schema, table}
		t := snap[k]
		t.Columns = append(t.Columns, column)
		t.Types = append(t.Types, typ)
		snap[k] = t
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("catalog: %w", err)
	}
	return snap, schemas, nil
}

// temporarySchema reports whether schema holds sessions' temporary tables.
func temporarySchema(schema string) bool {
	return strings.HasPrefix(schema, "pg_temp_") || strings.HasPrefix(schema, "pg_toast_temp_")
}

// unqualified adds to snap the entry of each unqualified name that a rule without a
// schema fills: the columns its table has in every schema of snap (temporary schemas left
// out, as in catalogSnap.schemas), when they are the same everywhere and no schema's
// table was left out for differing between databases
// (differ, where such a name is already told of). It returns the names left without an
// entry because their tables differ between schemas, sorted.
func unqualified(snap map[tableName]rewrite.Table, rules []config.FillRule, differ []tableName) []string {
	var ambiguous []string
	for _, r := range rules {
		if r.Schema != "" {
			continue
		}
		k := tableName{"", r.Table}
		if _, done := snap[k]; done || slices.Contains(ambiguous, r.Table) {
			continue
		}
		same, found := true, false
		var layout rewrite.Table
		for n, t := range snap {
			if n.table != r.Table || n.schema == "" || temporarySchema(n.schema) {
				continue
			}
			if found && !reflect.DeepEqual(layout, t) {
				same = false
			}
			layout, found = t, true
		}
		switch {
		case !same:
			ambiguous = append(ambiguous, r.Table)
		case found && !slices.ContainsFunc(differ, func(n tableName) bool { return n.table == r.Table }):
			snap[k] = layout
		}
	}
	sort.Strings(ambiguous)
	return ambiguous
}

// filled reports whether one of rules fills schema.table.
func filled(rules []config.FillRule, schema, table string) bool {
	for _, r := range rules {
		if r.Table == table && (r.Schema == "" || r.Schema == schema) {
			return true
		}
	}
	return false
}

// keyType returns the catalog type of a rule's key column: in the rule's schema, or, for
// a rule without one, in every schema that holds the table; "" when the catalog does not
// know it or the schemas differ.
func (c *catalog) keyType(r config.FillRule) string {
	t, ok := c.Table(r.Schema, r.Table)
	if !ok {
		return ""
	}
	for i, col := range t.Columns {
		if col == r.Column {
			return t.Types[i]
		}
	}
	return ""
}

// catalogRules reads the catalog of the tables cfgRules fill and returns the rules for the
// rewriter and the catalog it plans with (nil without rules). Call it whenever the rule
// set is (re)loaded: the catalog is then reread for the new rules. A snowflake tag on an
// integer or smallint key is refused: its IDs never fit. The rule is logged and left out;
// the others apply. When the upstream cannot be read now, every rule applies and the
// catalog is read at the next refresh (until then an INSERT without a column list is
// refused, and a too large ID is refused with 22003 per statement).
func (a *app) catalogRules(cfgRules []config.FillRule) ([]rewrite.FillRule, rewrite.Catalog, error) {
	if len(cfgRules) == 0 {
		return nil, nil, nil
	}
	cat := a.catalogNow()
	if cat == nil {
		var err error
		if cat, err = newCatalog(a.cfg.Store, a.cfg.Upstream, cfgRules); err != nil {
			return nil, nil, err
		}
	}
	cat.setRules(cfgRules)
	cat.setDatabases(catalogDatabases(a.routingConfig()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cat.load(ctx); err != nil {
		a.log.WithError(err).Warn("cannot read the columns of the filled tables; retrying at the next refresh")
	}
	a.warnDiffering(cat)
	var rules []rewrite.FillRule
	for _, r := range cfgRules {
		if typ := cat.keyType(r); a.router.IsSnowflake(r.Tag) && (typ == "integer" || typ == "smallint") {
			a.log.WithFields(logrus.Fields{"rule": r.String(), "type": typ}).
				Error("fill rule refused: a snowflake tag's IDs do not fit a key of type " + typ + "; use a segment tag or a bigint key")
			continue
		}
		rules = append(rules, rewrite.FillRule{Schema: r.Schema, Table: r.Table, Column: r.Column, Tag: r.Tag})
	}
	a.mu.Lock()
	a.catalog = cat
	a.mu.Unlock()
	return rules, cat, nil
}

// catalogNow is the catalog of the filled tables, nil until a rule set names one.
func (a *app) catalogNow() *catalog {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.catalog
}

// rewriterNow is the rewriter the proxy plans with.
func (a *app) rewriterNow() *rewrite.Rewriter {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rewriter
}

// refreshCatalog rereads the catalog every interval until ctx ends, dropping the
// rewriter's cached plans when the columns changed. It has nothing to read while no rule
// set names a table (the rules of leaf_fill may come later).
func (a *app) refreshCatalog(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cat := a.catalogNow()
		if cat == nil {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		changed, err := cat.load(lctx)
		cancel()
		switch {
		case err != nil:
			a.log.WithError(err).Warn("cannot read the columns of the filled tables")
		case changed:
			a.rewriterNow().CatalogChanged()
			a.log.Info("columns of the filled tables changed; plans dropped")
			a.warnDiffering(cat)
		}
	}
}
