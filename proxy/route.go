package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// This file routes a session to the upstream that serves the database its client names.
// The routing table is read once per session, at its startup packet: a table replaced
// with SetRoutes takes effect for the sessions that start afterwards, while a session in
// progress keeps the upstream it was sent to, and so does a cancel request for it.

// Route says where the sessions of one database go.
type Route struct {
	// Upstream is the server's address: host:port, or the path of a Unix socket. Empty
	// means Server.Upstream.
	Upstream string
	// Database is the name the upstream is asked for; empty means the name the client
	// asked for.
	Database string
}

// Routes maps the database names clients ask for to routes. The zero value and nil route
// nothing; build one with NewRoutes.
type Routes struct {
	named    map[string]Route
	fallback *Route
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
		return packet, true
	}
	rt, ok := table.Lookup(database)
	if !ok {
		c.refuse(sqlstate.InvalidCatalogName, fmt.Sprintf("database %q does not exist", database))
		return nil, false
	}
	c.upstreamAddr = rt.Upstream
	if c.upstreamAddr == "" {
		c.upstreamAddr = s.Upstream
	}
	if rt.Database == "" || rt.Database == database {
		return packet, true
	}
	return withDatabase(packet, rt.Database), true
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
