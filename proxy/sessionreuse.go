package proxy

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	database := params["database"]
	if database == "" {
		database = params["user"]
	}
	k := pool.Key{Database: database, User: params["user"]}
	if c.upstreamAddr != s.Upstream {
		k.Database += "@" + c.upstreamAddr // as Server.poolKey names it
	}
	return &reuseTarget{key: startupKey(c.upstreamAddr, routed), pool: k}
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
		c.srv.idleServers.closeServer(sc)
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
// next session of target; a connection that does not reset cleanly is closed.
func (s *Server) recycle(target *reuseTarget, sc *serverConn) {
	l := s.idleLimits(target)
	_ = sc.nc.SetDeadline(time.Now().Add(l.resetTimeout))
	err := sc.sendReset()
	if err == nil {
		err = sc.awaitReset()
	}
	if err != nil {
		s.logger().WithError(err).Debug("server connection not reused: its reset failed")
		s.idleServers.closeServer(sc)
		return
	}
	s.idleServers.put(target, sc, l, false)
}

// idleLimits are the limits of target's idle connections.
type idleLimits struct {
	pool.Limits
	resetTimeout time.Duration // server-reset-timeout
}

// idleLimits returns the limits of target's idle connections: its route's or user's
// pool-size, server-idle-timeout and server-lifetime, else the server's, else the
// defaults.
func (s *Server) idleLimits(target *reuseTarget) idleLimits {
	s.pooling.mu.Lock()
	settings := s.poolSettings(s.Pooling) // the routes' limits too
	s.pooling.mu.Unlock()
	l := idleLimits{Limits: settings.Limits, resetTimeout: settings.ServerResetTimeout}
	if settings.PerKey != nil {
		l.Limits = l.Override(settings.PerKey(target.pool))
	}
	if l.PoolSize <= 0 {
		l.PoolSize = pool.DefaultPoolSize
	}
	if l.ServerIdleTimeout == 0 {
		l.ServerIdleTimeout = pool.DefaultServerIdleTimeout
	}
	if l.ServerLifetime == 0 {
		l.ServerLifetime = pool.DefaultServerLifetime
	}
	if l.resetTimeout <= 0 {
		l.resetTimeout = pool.DefaultServerResetTimeout
	}
	return l
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

// idleServers are the server connections of session mode waiting for their next
// session, by reuseTarget key, newest last.
type idleServers struct {
	mu     sync.Mutex
	byKey  map[string][]*idleServer
	counts map[pool.Key]int // idle connections of each (database, user)
	closed bool
	reused atomic.Uint64 // sessions served by a connection of an earlier one
}

// idleServer is one idle server connection.
type idleServer struct {
	sc     *serverConn
	target *reuseTarget
	timer  *time.Timer // closes it after server-idle-timeout; nil: never
	// lifetime is its server-lifetime: older, it serves no later session (0: no limit).
	lifetime time.Duration
	// resetDue: its DISCARD ALL was sent and the answer is to be read, within
	// resetTimeout, by the session that takes it.
	resetDue     bool
	resetTimeout time.Duration
}

// take returns the newest idle server connection of key that is fit to serve, nil when
// there is none. One past its lifetime, whose reset fails, or whose server sent
// something or hung up while it was idle, is closed.
func (p *idleServers) take(key string) *serverConn {
	for {
		e := p.pop(key)
		if e == nil {
			return nil
		}
		if e.timer != nil {
			e.timer.Stop()
		}
		if e.resetDue {
			_ = e.sc.nc.SetDeadline(time.Now().Add(e.resetTimeout))
			if err := e.sc.awaitReset(); err != nil {
				p.closeServer(e.sc)
				continue
			}
		}
		if e.lifetime > 0 && time.Since(e.sc.born) > e.lifetime || e.sc.r.br.Buffered() > 0 || !socketQuiet(e.sc.nc) {
			p.closeServer(e.sc)
			continue
		}
		p.reused.Add(1)
		return e.sc
	}
}

func (p *idleServers) pop(key string) *idleServer {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.byKey[key]

	if len(list) == 0 {
		return nil
	}
	e := list[len(list)-1]
	p.removeLocked(e)
	return e
}

// put keeps sc idle for target, unless its (database, user) has pool-size idle
// connections already, it is past its lifetime or the set is closed; then sc is closed,
// on a goroutine of its own (an event loop may call put). resetDue says that sc's
// DISCARD ALL has been sent and its answer is still to be read (see take).
func (p *idleServers) put(target *reuseTarget, sc *serverConn, l idleLimits, resetDue bool) {
	p.mu.Lock()
	if p.closed || p.counts[target.pool] >= l.PoolSize || l.ServerLifetime > 0 && time.Since(sc.born) > l.ServerLifetime {
		p.mu.Unlock()
		go p.closeServer(sc)
		return
	}
	if p.byKey == nil {
		p.byKey = make(map[string][]*idleServer)
		p.counts = make(map[pool.Key]int)
	}
	e := &idleServer{sc: sc, target: target, lifetime: max(l.ServerLifetime, 0), resetDue: resetDue, resetTimeout: l.resetTimeout}
	p.byKey[target.key] = append(p.byKey[target.key], e)
	p.counts[target.pool]++
	if l.ServerIdleTimeout > 0 {
		e.timer = time.AfterFunc(l.ServerIdleTimeout, func() { p.expire(e) })
	}
	p.mu.Unlock()
}

// expire closes e when it is still idle.
func (p *idleServers) expire(e *idleServer) {
	p.mu.Lock()
	ok := p.removeLocked(e)
	p.mu.Unlock()
	if ok {
		p.closeServer(e.sc)
	}
}

// removeLocked takes e out of the set, reporting whether it was there.
func (p *idleServers) removeLocked(e *idleServer) bool {
	list := p.byKey[e.target.key]
	for i, x := range list {
		if x != e {
			continue
		}
		list = append(list[:i], list[i+1:]...)
		if len(list) == 0 {
			delete(p.byKey, e.target.key)
		} else {
			p.byKey[e.target.key] = list
		}
		if p.counts[e.target.pool]--; p.counts[e.target.pool] == 0 {
			delete(p.counts, e.target.pool)
		}
		return true
	}
	return false
}

// close closes every idle connection; put closes what comes later.
func (p *idleServers) close() {
	p.mu.Lock()
	p.closed = true
	var all []*idleServer
	for _, list := range p.byKey {
		all = append(all, list...)
	}
	p.byKey, p.counts = nil, nil
	p.mu.Unlock()
	for _, e := range all {
		if e.timer != nil {
			e.timer.Stop()
		}
		p.closeServer(e.sc)
	}
}

// count returns how many server connections are idle.
func (p *idleServers) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.counts {
		n += c
	}
	return n
}

// SessionServers returns how many server connections of session mode wait idle for a
// later session, and how many sessions have been served by one so far (see
// ReuseSessionServers).
func (s *Server) SessionServers() (idle int, reused uint64) {
	return s.idleServers.count(), s.idleServers.reused.Load()
}

// closeServer ends a server connection of no session: Terminate, then close.
func (p *idleServers) closeServer(sc *serverConn) {
	_ = sc.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeHeader(sc.w, clientTerminate, 0)
	_ = sc.w.Flush()
	_ = sc.nc.Close()
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
