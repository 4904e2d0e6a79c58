package proxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"strings"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// The startup of a session in transaction mode: the proxy answers it.

// servePooled runs a session in transaction mode after its startup packet: the proxy
// answers the startup itself, with the ParameterStatus values of a server connection of
// the pool, and a cancel key of its own.
func (c *conn) servePooled(packet []byte) (parked bool) {
	s := c.srv
	params := startupParams(packet)
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
	ctx, cancel := context.WithTimeout(c.ctx, s.startupTimeout())
	defer cancel()
	p, err := s.serverPool()
	if err != nil {
		c.refuse(sqlstate.ConnectionUnable, err.Error())
		return
	}
	srv, err := p.Acquire(ctx, v.key)
	if err != nil {
		code := sqlstate.ConnectionUnable
		var pe *pool.Error
		if errors.As(err, &pe) && pe.Code != "" {
			code = pe.Code
		}
		c.log.WithError(err).Warn("cannot connect to upstream")
		c.refuse(code, err.Error())
		return
	}
	sc := newServerConn(v, s.maxMessageSize())
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		srv.Release(pool.Clean)
		return
	}
	c.server = sc
	c.mu.Unlock()
	c.cr = msgReader{br: bufio.NewReaderSize(c.client, readBufferSize), maxBody: sc.r.maxBody}
	c.cw = bufio.NewWriterSize(c.client, writeBufferSize)

	// The client's settings: the server's, then those of its startup packet.
	pc := srv.Conn()
	status := make([]paramValue, 0, len(pc.login))
	for _, pv := range pc.login {
		lname := strings.ToLower(pv.name)
		if value, ok := params[lname]; ok && !notCarried[lname] {
			pv.value = value
		}
		if !notCarried[lname] {
			v.params[lname] = pv.value
		}
		status = append(status, pv)
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
	for name, value := range parseOptions(params["options"]) {
		v.params[strings.ToLower(name)] = value
	}
	srv.Release(pool.Clean)

	var key [8]byte
	_, _ = rand.Read(key[:])
	key[0] &= 0x7f // a positive process ID, as some clients expect
	c.setCancelKey(string(key[:]))
	out := appendMessage(nil, serverAuthentication, []byte{0, 0, 0, 0})
	for _, pv := range status {
		body := appendMessage(nil, serverParameterStatus, []byte(pv.name), []byte{0}, []byte(pv.value), []byte{0})
		c.noteParameterStatus(body[5:])
		out = append(out, body...)
	}
	out = appendMessage(out, serverBackendKeyData, key[:])
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
