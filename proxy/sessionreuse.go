package proxy

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leafproxy/leafproxy/proxy/pgauth"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// Session mode's server connections serve more than one session, as PgBouncer's session
// pool does. A session that the client leaves between transactions, with nothing
// outstanding, gives its server connection back: the proxy resets it with DISCARD ALL
// and keeps it idle, and the next session of the same upstream and the same startup
// packet (user, database and every parameter, so that the reset leaves the settings that
// session asks for) is served by it, without a dial, a TLS handshake or a login. That
// needs the proxy to have authenticated the client itself: a relayed login is the
// database's to check, every time. A connection left any other way (in a transaction, in
// the middle of a cycle, after an error of the proxy's) is closed, never reused. An event
// loop sends the DISCARD ALL as the session ends and keeps the connection idle at once;
// the session that takes it reads the answer (by then usually there), so that no
// goroutine waits for it. A goroutine pair's session waits for it itself (recycle).

// discardAll is the Query that resets a server connection for the next session:
// DISCARD ALL closes cursors, drops prepared statements and temporary tables, releases
// advisory locks, stops listening, and resets every setting (to the values of the startup
// packet, the next session's too) and the session authorization.
var discardAll = func() []byte {
	b, at := beginMessage(nil, clientQuery)
	return endMessage(append(b, "DISCARD ALL\x00"...), at)
}()

// reuseTarget is where a session's server connection may go when the session ends: set
// at startup when the server connection may serve another session.
type reuseTarget struct {
	key  string   // the upstream's address and the startup parameters sent there, sorted
	pool pool.Key // whose pool-size and timeouts apply to the idle connections
}

// reuseTargetOf returns the session's reuseTarget, nil when its server connection must
// close with it: the proxy relayed the login (auth-type passthrough), the server does not
// reuse, the session is a replication connection, or its startup asks for a protocol
// version other than 3.0 or for protocol options (_pq_.*), which the server may answer
// with a NegotiateProtocolVersion a later session would not get. routed is the startup
// packet as it goes upstream; params its parameters (as routed).
func (c *conn) reuseTargetOf(routed []byte, params map[string]string) *reuseTarget {
	s := c.srv
	if !s.ReuseSessionServers || c.front == nil || c.transactionPooling() {
		return nil
	}
	if r := params["replication"]; r != "" && r != "false" {
		return nil
	}
	if binary.BigEndian.Uint32(routed[4:8]) != protocolMajor3<<16 {
		return nil
	}
	for name := range params {
		if strings.HasPrefix(name, "_pq_.") {
			return nil
		}
	}
	return &reuseTarget{key: startupKey(c.upstreamAddr, routed), pool: s.sessionKey(c.upstreamAddr, params)}
}

// startupKey names the server connections of upstream addr started with the startup
// packet: the protocol version and the parameters, sorted by name (clients send them in
// any order).
func startupKey(addr string, packet []byte) string {
	params := startupParams(packet)
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString(addr)
	b.WriteByte(0)
	b.Write(packet[4:8])
	for _, name := range names {
		b.WriteString(name)
		b.WriteByte(0)
		b.WriteString(params[name])
		b.WriteByte(0)
	}
	return b.String()
}

// startReused serves the session with sc, an idle server connection of its reuseTarget:
// the client is told AuthenticationOk, the ParameterStatus values the server reported,
// a cancel key of the proxy's own (the previous session's client knew the server's) and
// ReadyForQuery. It reports false when the connection is done.
func (c *conn) startReused(sc *serverConn) bool {
	if !c.useServer(sc) {
		c.srv.sessionPool.closeServer(sc)
		return false
	}
	key := []byte(sc.key)
	_, _ = rand.Read(key[4:]) // the server's process ID, a secret of the proxy's
	c.registerCancelKey(string(key))

	out := c.cw.AvailableBuffer()
	out = binary.BigEndian.AppendUint32(append(out, serverAuthentication, 0, 0, 0, 8), pgauth.AuthOK)
	for _, p := range sc.params {
		var at int
		out, at = beginMessage(out, serverParameterStatus)
		out = endMessage(append(out, p...), at)
	}
	var at int
	out, at = beginMessage(out, serverBackendKeyData)
	out = endMessage(append(out, key...), at)
	out = append(out, serverReadyForQuery, 0, 0, 0, 5, txIdle)
	if _, err := c.cw.Write(out); err != nil {
		return false
	}
	if err := c.cw.Flush(); err != nil {
		return false
	}
	c.log.Debug("session started on a server connection of an earlier session")
	return true
}

// leave ends the client side when the client sends Terminate (of n body bytes) and the
// server connection may serve another session: the Terminate does not go upstream.
func (c *conn) leave(n int) error {
	if _, err := c.cr.br.Discard(n); err != nil {
		return unexpected(err)
	}
	c.clientLeft = true
	return nil
}

// leftIdle reports whether the client left (Terminate, or the end of its stream at a
// message boundary) between transactions, with nothing outstanding and nothing of the
// proxy's own in progress, so that the server connection may serve another session.
// Only the session's handler goroutine calls it, once the client side has ended.
func (c *conn) leftIdle() bool {
	if c.reuse == nil || !c.clientLeft || c.told.Load() ||
		c.server.txStatus.Load() != txIdle || c.pending.Load() != 0 {
		return false
	}
	ss := &c.sess
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return !ss.skip && ss.copyIn == nil && ss.local == nil && ss.localStmt == nil && ss.cur == nil
}

// keepServer ends a goroutine pair's session whose client left idle (see leftIdle), its
// server connection going to the next session when stopped reports that the server side
// stopped at a message boundary.
func (c *conn) keepServer(stopped bool) {
	c.mu.Lock()
	sc := c.server
	keep := stopped && !c.closed
	c.serverKept = keep
	c.mu.Unlock()
	c.close()
	if keep {
		c.srv.recycle(c.reuse, sc)
	}
}

// recycle resets sc, a server connection its session left idle, and keeps it for the
// next session of target, with the room the session held in the session pool; a
// connection that does not reset cleanly is closed and its room given back.
func (s *Server) recycle(target *reuseTarget, sc *serverConn) {
	l := s.sessionLimits(target.pool)
	_ = sc.nc.SetDeadline(time.Now().Add(l.resetTimeout))
	err := sc.sendReset()
	if err == nil {
		err = sc.awaitReset()
	}
	if err != nil {
		s.logger().WithError(err).Debug("server connection not reused: its reset failed")
		s.sessionPool.closeServer(sc)
		s.sessionPool.release(target.pool)
		return
	}
	s.sessionPool.put(target, sc, l, false)
}

// sendReset writes DISCARD ALL to the server connection (see awaitReset).
func (sc *serverConn) sendReset() error {
	if _, err := sc.w.Write(discardAll); err != nil {
		return err
	}
	return sc.w.Flush()
}

// awaitReset reads the answer to the DISCARD ALL of sendReset, which must come alone
// (what the server still owed the previous session fails the reset) before the
// connection's deadline; ParameterStatus values it reports are recorded, notices and
// notifications of the previous session dropped. Output still buffered goes first.
func (sc *serverConn) awaitReset() error {
	if err := sc.w.Flush(); err != nil {
		return err
	}
	done := false
	for {
		typ, n, err := sc.r.next()
		if err != nil {
			return err
		}
		body, err := sc.r.readBody(n)
		if err != nil {
			return err
		}
		switch typ {
		case serverCommandComplete:
			if done || string(body) != "DISCARD ALL\x00" {
				return fmt.Errorf("unexpected CommandComplete %q", body)
			}
			done = true
		case serverParameterStatus:
			sc.noteParameterStatus(body)
			sc.recordParameter(body)
		case serverNoticeResponse, serverNotification:
		case serverReadyForQuery:
			if !done || len(body) != 1 || body[0] != txIdle {
				return fmt.Errorf("unexpected ReadyForQuery %q", body)
			}
			sc.txStatus.Store(txIdle)
			return sc.nc.SetDeadline(noDeadline)
		default:
			return fmt.Errorf("unexpected message %q", typ)
		}
	}
}

// recordParameter keeps a ParameterStatus body the server sent, replacing the value of
// the same parameter, for the clients of later sessions (see startReused).
func (sc *serverConn) recordParameter(body []byte) {
	name, _, ok := cString(body)
	if !ok {
		return
	}
	for i, p := range sc.params {
		if n, _, _ := cString(p); n == name {
			sc.params[i] = append(p[:0], body...)
			return
		}
	}
	sc.params = append(sc.params, append([]byte(nil), body...))
}

// serverCancelPacket returns the CancelRequest packet for the session's server
// connection: the client's own when the client was given the server's key, else the
// same request with the server's key (a session on a server connection of an earlier
// one; see startReused).
func (c *conn) serverCancelPacket(packet []byte) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.server == nil || c.server.key == c.cancelKey {
		return packet
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(8+len(c.server.key)))
	out = binary.BigEndian.AppendUint32(out, cancelRequestCode)
	return append(out, c.server.key...)
}
