package proxy

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strings"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pgauth"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// The startup of a session in transaction mode: the proxy answers it.

// servePooled runs a session in transaction mode after its startup packet, whose
// parameters are params (as routed): the proxy answers the startup itself, with the
// ParameterStatus values its server connections of the session's pool key reported at
// their login, and a cancel key of its own.
func (c *conn) servePooled(params map[string]string) (parked bool) {
	s := c.srv
	user := params["user"]
	if user == "" {
		c.refuse(sqlstate.InvalidAuthorizationSpecification, "no PostgreSQL user name specified in startup packet")
		return
	}
	if params["replication"] != "" && params["replication"] != "false" {
		c.refuse(sqlstate.FeatureNotSupported, "replication connections are not supported in transaction pool mode")
		return
	}
	database := params["database"] // as routed
	if database == "" {
		database = user
	}
	v := newPooledConn(c, s.poolKey(c.upstreamAddr, database, user, c.front))
	w := s.welcomeOf(v.key)
	if w == nil {
		if w = c.fetchWelcome(v.key); w == nil {
			return
		}
	}
	sc := &serverConn{nc: v, r: msgReader{br: takeReader(v), maxBody: s.maxMessageSize()}, w: takeWriter(v)}
	if !c.useServer(sc) {
		return
	}

	// The client's settings: the server's, then those of its startup packet.
	out := c.cw.AvailableBuffer()
	out = binary.BigEndian.AppendUint32(append(out, serverAuthentication, 0, 0, 0, 8), pgauth.AuthOK)
	for _, p := range w.params {
		value := p.value
		if p.carried {
			if cv, ok := params[p.lname]; ok {
				value = cv
			}
			v.params[p.lname] = value
		}
		var at int
		out, at = beginMessage(out, serverParameterStatus)
		out = append(append(append(append(out, p.name...), 0), value...), 0)
		out = endMessage(out, at)
		if p.noted {
			c.noteParameterStatus(out[at+4:])
		}
	}
	for name, value := range params {
		switch lname := strings.ToLower(name); lname {
		case "user", "database", "replication", "options":
		default:
			if !notCarried[lname] {
				v.params[lname] = value
			}
		}
	}
	if opts := params["options"]; opts != "" {
		for name, value := range parseOptions(opts) {
			v.params[strings.ToLower(name)] = value
		}
	}

	var key [8]byte
	_, _ = rand.Read(key[:])
	key[0] &= 0x7f // a positive process ID, as some clients expect
	c.setCancelKey(string(key[:]))
	out = append(append(out, serverBackendKeyData, 0, 0, 0, 12), key[:]...)
	out = append(out, serverReadyForQuery, 0, 0, 0, 5, txIdle)
	if _, err := c.cw.Write(out); err != nil {
		return
	}
	if err := c.cw.Flush(); err != nil {
		return
	}
	sc.txStatus.Store(txIdle)
	_ = c.client.SetDeadline(noDeadline)
	c.log.Debug("session started in transaction mode")
	return c.relayPooled(v)
}

// parseOptions returns the settings of a startup packet's options: -c name=value and
// --name=value, separated by spaces (backslash escapes a space).
func parseOptions(s string) map[string]string {
	out := make(map[string]string)
	var args []string
	var cur strings.Builder
	esc := false
	for _, r := range s {
		switch {
		case esc:
			cur.WriteRune(r)
			esc = false
		case r == '\\':
			esc = true
		case r == ' ':
			if cur.Len() > 0 {
				args = append(args, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		args = append(args, cur.String())
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-c" && i+1 < len(args):
			i++
			a = args[i]
		case strings.HasPrefix(a, "-c"):
			a = a[2:]
		case strings.HasPrefix(a, "--"):
			a = a[2:]
		default:
			continue
		}
		if name, value, ok := strings.Cut(a, "="); ok {
			out[strings.ReplaceAll(name, "-", "_")] = value
		}
	}
	return out
}

// pooled returns the session's pooledConn in transaction mode, nil in session mode.
func (c *conn) pooled() *pooledConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server == nil {
		return nil
	}
	v, _ := c.server.nc.(*pooledConn)
	return v
}

// welcome is what a new client of a pool key is told at its startup: the ParameterStatus
// values a server connection of the key reported at its login.
type welcome struct {
	params []welcomeParam
}

type welcomeParam struct {
	name, value string
	lname       string // name in lower case
	carried     bool   // a client's own value of it (startup packet, SET) is carried
	noted       bool   // the session acts on it (see conn.noteParameterStatus)
}

func newWelcome(login []paramValue) *welcome {
	w := &welcome{params: make([]welcomeParam, len(login))}
	for i, pv := range login {
		lname := strings.ToLower(pv.name)
		w.params[i] = welcomeParam{name: pv.name, value: pv.value, lname: lname, carried: !notCarried[lname],
			noted: notesParameter(pv.name)}
	}
	return w
}

// noteLogin records the ParameterStatus values of a server connection of key that has
// just logged in: the newest login's are what the key's new clients are told, so that a
// change on the server (a new version, ALTER ROLE … SET, a failover) reaches them once
// a connection has logged in since.
func (s *Server) noteLogin(key pool.Key, login []paramValue) {
	s.welcomes.Store(key, newWelcome(login))
}

// welcomeOf returns what a new client of key is told, nil before any server connection
// of key has logged in.
func (s *Server) welcomeOf(key pool.Key) *welcome {
	if w, ok := s.welcomes.Load(key); ok {
		return w.(*welcome)
	}
	return nil
}

// fetchWelcome borrows a server connection of key for the first client of key, which
// logs one in (see Server.noteLogin for the next clients); a client that the pool cannot
// serve within the startup timeout is refused here, at its startup.
// It returns nil when the connection is done (the client has been told why).
func (c *conn) fetchWelcome(key pool.Key) *welcome {
	s := c.srv
	ctx, cancel := context.WithTimeout(c.ctx, s.startupTimeout())
	defer cancel()
	p, err := s.serverPool()
	if err != nil {
		c.refuse(sqlstate.ConnectionUnable, err.Error())
		return nil
	}
	srv, err := p.Acquire(ctx, key)
	for errors.Is(err, pool.ErrWaitTimeout) && ctx.Err() == nil {
		// query-wait-timeout bounds a statement's wait; a startup waits for the
		// connection being logged in as long as the startup may last.
		srv, err = p.Acquire(ctx, key)
	}
	if err != nil {
		code := sqlstate.ConnectionUnable
		var pe *pool.Error
		if errors.As(err, &pe) && pe.Code != "" {
			code = pe.Code
		}
		c.log.WithError(err).Warn("cannot connect to upstream")
		c.refuse(code, err.Error())
		return nil
	}
	w := newWelcome(srv.Conn().login)
	srv.Release(pool.Clean)
	return w
}
