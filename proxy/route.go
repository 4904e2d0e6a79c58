package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// This file routes a session to the upstream that serves the database its client names,
// and picks its pool mode. The routing table is read once per session, at its startup
// packet: a table replaced with SetRoutes takes effect for the sessions that start
// afterwards, while a session in progress keeps the upstream and the mode it was given,
// and so does a cancel request for it. The pool limits of the table apply to the pools
// of transaction mode when they are created and when ReloadPooling runs.

// Route says where the sessions of one database go.
type Route struct {
	// Upstream is the server's address: host:port, or the path of a Unix socket. Empty
	// means Server.Upstream.
	Upstream string
	// Database is the name the upstream is asked for; empty means the name the client
	// asked for.
	Database string
	// PoolMode is the pool mode of the database's sessions; empty means Server.PoolMode.
	PoolMode PoolMode
	// Pool holds the limits of the database's pools in transaction mode (pool size,
	// min pool size, …); its zero fields take those of Server.Pooling.
	Pool pool.Limits
	// MaxDBConnections is the most server connections of the database over all its
	// users; 0 means Server.Pooling's.
	MaxDBConnections int
}

// UserPooling overrides, for one user, the pool mode and limits of the databases the
// user's sessions go to.
type UserPooling struct {
	// PoolMode is the pool mode of the user's sessions; empty means the route's.
	PoolMode PoolMode
	// Pool holds the limits of the user's pools; zero fields take the route's.
	Pool pool.Limits
}

// Routes maps the database names clients ask for to routes. The zero value and nil route
// nothing; build one with NewRoutes.
type Routes struct {
	named    map[string]Route
	fallback *Route
	users    map[string]UserPooling
}

// NewRoutes returns a routing table: named by database name, and fallback, when not
// nil, for every other name. Without a fallback a client asking for a database not named
// is refused with SQLSTATE 3D000, as PostgreSQL refuses a database that does not exist.
func NewRoutes(named map[string]Route, fallback *Route) *Routes {
	r := &Routes{named: make(map[string]Route, len(named))}
	for name, rt := range named {
		r.named[name] = rt
	}
	if fallback != nil {
		fb := *fallback
		r.fallback = &fb
	}
	return r
}

// WithUsers returns a copy of the table whose users override the pool mode and limits
// of their routes.
func (r *Routes) WithUsers(users map[string]UserPooling) *Routes {
	out := NewRoutes(r.named, r.fallback)
	out.users = make(map[string]UserPooling, len(users))
	for name, u := range users {
		out.users[name] = u
	}
	return out
}

// Lookup returns the route of database, and false when nothing serves it.
func (r *Routes) Lookup(database string) (Route, bool) {
	if r == nil {
		return Route{}, false
	}
	if rt, ok := r.named[database]; ok {
		return rt, true
	}
	if r.fallback != nil {
		return *r.fallback, true
	}
	return Route{}, false
}

// routing is the Server's routing table; nil sends every session to Server.Upstream
// with the database the client named.
type routing struct {
	table atomic.Pointer[Routes]
}

// SetRoutes replaces the routing table while the server runs: sessions that start
// afterwards are routed by routes, sessions in progress keep their upstream. nil routes
// every session to Upstream, as when SetRoutes was never called.
func (s *Server) SetRoutes(routes *Routes) {
	s.routing.table.Store(routes)
}

// route picks the upstream of a client's session from the database of its startup
// packet (the user name when it names none, as in PostgreSQL) and returns the packet to
// send upstream, naming the route's database. It refuses the client with 3D000 and
// returns false when no route serves the database.
func (c *conn) route(packet []byte, params map[string]string) ([]byte, bool) {
	s := c.srv
	database := params["database"]
	if database == "" {
		database = params["user"]
	}
	table := s.routing.table.Load()
	if table == nil {
		c.upstreamAddr = s.Upstream
		c.poolMode = s.defaultPoolMode()
		return packet, true
	}
	rt, ok := table.Lookup(database)
	if !ok {
		c.refuse(sqlstate.InvalidCatalogName, fmt.Sprintf("database %q does not exist", database))
		return nil, false
	}
	c.poolMode = table.poolMode(rt, params["user"], s.defaultPoolMode())
	c.upstreamAddr = rt.Upstream
	if c.upstreamAddr == "" {
		c.upstreamAddr = s.Upstream
	}
	if rt.Database == "" || rt.Database == database {
		return packet, true
	}
	return withDatabase(packet, rt.Database), true
}

// defaultPoolMode is Server.PoolMode, PoolSession when unset.
func (s *Server) defaultPoolMode() PoolMode {
	if s.PoolMode == "" {
		return PoolSession
	}
	return s.PoolMode
}

// poolMode is the pool mode of a session of user routed by rt: the user's, else the
// route's, else def.
func (r *Routes) poolMode(rt Route, user string, def PoolMode) PoolMode {
	if u, ok := r.users[user]; ok && u.PoolMode != "" {
		return u.PoolMode
	}
	if rt.PoolMode != "" {
		return rt.PoolMode
	}
	return def
}

// transactionPooling reports whether the session runs in transaction mode; route
// decides.
func (c *conn) transactionPooling() bool { return c.poolMode == PoolTransaction }

// routeOfPool returns the route whose sessions use the pools of a pool key's database
// (see Server.poolKey: the database as routed, followed by "@" and the address when
// that is not upstream), for its pool limits. Several routes may lead to one database
// and so share its pools: a route that sets limits wins over one that does not (the
// configuration refuses routes to one database with different limits), then the route
// named as the database, then the first by name. Without a named route, the fallback.
func (r *Routes) routeOfPool(keyDatabase, upstream string) (Route, bool) {
	if r == nil {
		return Route{}, false
	}
	var (
		best     Route
		bestName string
		found    bool
	)
	rank := func(name string, rt Route) int {
		n := 0
		if rt.Pool != (pool.Limits{}) || rt.MaxDBConnections != 0 {
			n += 2
		}
		if name == keyDatabase {
			n++
		}
		return n
	}
	for name, rt := range r.named {
		routed, addr := rt.Database, rt.Upstream
		if routed == "" {
			routed = name
		}
		if addr == "" {
			addr = upstream
		}
		if addr != upstream {
			routed += "@" + addr
		}
		if routed != keyDatabase {
			continue
		}
		if !found || rank(name, rt) > rank(bestName, best) || (rank(name, rt) == rank(bestName, best) && name < bestName) {
			best, bestName, found = rt, name, true
		}
	}
	if found {
		return best, true
	}
	if r.fallback != nil {
		return *r.fallback, true
	}
	return Route{}, false
}

// routedLimits returns the pool limits of a pool key from the routing table in use: the
// user's, over the route's (Settings.PerKey).
func (s *Server) routedLimits(k pool.Key) pool.Limits {
	table := s.routing.table.Load()
	rt, _ := table.routeOfPool(k.Database, s.Upstream)
	l := rt.Pool
	if table == nil {
		return l
	}
	if u, ok := table.users[k.User]; ok {
		l = l.Override(u.Pool)
	}
	return l
}

// routedMaxDB returns the max-db-connections of a pool key's database from the routing
// table in use (Settings.PerDatabase).
func (s *Server) routedMaxDB(database string) int {
	rt, _ := s.routing.table.Load().routeOfPool(database, s.Upstream)
	return rt.MaxDBConnections
}

// withDatabase returns a copy of a StartupMessage packet whose database parameter is
// database, added at the end when the client sent none; every other parameter keeps its
// place.
func withDatabase(packet []byte, database string) []byte {
	out := make([]byte, 8, len(packet)+len(database)+16)
	copy(out, packet[:8])
	rest := packet[8:]
	found := false
	for len(rest) > 0 && rest[0] != 0 {
		name, after, ok := bytes.Cut(rest, []byte{0})
		if !ok {
			break
		}
		value, after, ok := bytes.Cut(after, []byte{0})
		if !ok {
			break
		}
		rest = after
		out = append(append(out, name...), 0)
		if string(name) == "database" {
			found = true
			value = []byte(database)
		}
		out = append(append(out, value...), 0)
	}
	if !found {
		out = append(append(append(out, "database"...), 0), database...)
		out = append(out, 0)
	}
	out = append(out, 0)
	binary.BigEndian.PutUint32(out, uint32(len(out)))
	return out
}
