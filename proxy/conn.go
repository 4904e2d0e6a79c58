package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pgauth"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// conn is a session: one client connection, from its startup packet to its end, and
// what the proxy keeps of the client's protocol state. Once the client has sent its
// startup packet, the session holds a server connection (serverConn) that serves it.
type conn struct {
	srv    *Server
	id     uint64
	ctx    context.Context // ends when the connection is closed
	cancel context.CancelFunc
	log    logrus.FieldLogger

	mu     sync.Mutex // guards client, server.nc and closed against close from other goroutines
	client net.Conn
	server *serverConn // the server connection that serves the session; nil before startup
	closed bool

	cr msgReader // from the client

	// cwMu serialises writes to the client: the server-to-client relay writes there,
	// and so do Shutdown (a final FATAL) and the client-side relay (its own errors).
	cwMu sessionLock
	cw   *bufio.Writer

	cancelKey string                  // BackendKeyData the client was given, registered in srv.cancels; under mu
	session   bool                    // holds a session slot; under mu
	idWait    context.CancelCauseFunc // ends the wait for an ID in progress (see nextID); under mu

	// Protocol state of the client side, shared by the two relay goroutines.
	pending atomic.Int64 // ReadyForQuery messages the client still awaits
	told    atomic.Bool  // the proxy has sent the client its own final error

	sess sessionState // statement map and request cycles; used only when rewriting

	front *pgauth.Login // how the proxy logs in for a client it authenticated itself; nil: relayed

	// loop is the event loop session while a loop serves the connection; client and
	// server.nc then hold placeholders, and everything happens on the loop's goroutine.
	loop atomic.Pointer[loopSession]

	upstreamAddr string   // where the session's upstream is (see route); set before the dial
	poolMode     PoolMode // how the session gets server connections (see route)

	// Giving the server connection to a later session (sessionreuse.go).
	reuse           *reuseTarget // where it may go; nil: it closes with the session
	room            *pool.Key    // the session holds room in the session pool for this key (sessionpool.go); under mu
	clientLeft      bool         // the client sent Terminate or ended its stream at a message boundary
	upstreamStopped bool         // the goroutine pair's server side stopped at a message boundary
	keeping         atomic.Bool  // the goroutine pair's client side is stopping the server side
	serverKept      bool         // close leaves the server connection open; under mu
}

func newConnState(s *Server, nc net.Conn) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{srv: s, id: s.nextID.Add(1), ctx: ctx, cancel: cancel, client: nc}
	c.log = s.logger().WithFields(logrus.Fields{"conn_id": c.id, "remote": nc.RemoteAddr().String()})
	return c
}

// serve runs the connection from startup to close.
func (c *conn) serve() {
	adopted := false
	defer func() {
		if !adopted {
			c.close()
		}
	}()
	defer c.recoverPanic()
	s := c.srv
	_ = c.client.SetDeadline(time.Now().Add(s.startupTimeout()))
	packet, err := c.negotiate()
	if err != nil || packet == nil {
		if err != nil {
			c.log.WithError(err).Debug("startup failed")
		}
		return
	}
	params := startupParams(packet)
	c.log = c.log.WithFields(logrus.Fields{"user": params["user"], "database": params["database"]})
	routed, ok := c.route(packet, params)
	if !ok {
		return
	}
	if s.inShutdown.Load() {
		c.refuse(sqlstate.CannotConnectNow, "the database system is shutting down")
		return
	}
	if !s.acquireSession() {
		c.refuse(sqlstate.TooManyConnections, "sorry, too many clients already")
		return
	}
	if !c.holdSession() {
		return
	}
	if !c.authenticateClient(params) {
		return
	}
	if &routed[0] != &packet[0] { // the route names another database
		params = startupParams(routed)
	}
	if c.transactionPooling() {
		adopted = c.servePooled(params) // a parked session goes on without this goroutine
		return
	}
	c.reuse = c.reuseTargetOf(routed, params)
	if c.front != nil {
		sc, ok := c.admitSession(params)
		if !ok {
			return
		}
		if sc != nil {
			if c.startReused(sc) {
				adopted = c.run()
			}
			return
		}
	}
	if err := c.connectUpstream(routed); err != nil {
		// The client learns which address failed and how (the dial or TLS error names
		// addresses only, never credentials), so that a wrong upstream is found from the
		// client's side too.
		c.log.WithError(err).Warn("cannot connect to upstream")
		c.refuseDetail(sqlstate.ConnectionUnable, "could not connect to the upstream server",
			fmt.Sprintf("upstream %s: %v", c.upstreamAddr, err))
		return
	}
	if err := c.authenticate(); err != nil {
		c.log.WithError(err).Debug("startup did not complete")
		return
	}
	c.log.Debug("session started")
	adopted = c.run()
}

// run serves an established session: an event loop takes it over (reporting true), or
// this goroutine and another relay it until it ends.
func (c *conn) run() (adopted bool) {
	_ = c.client.SetDeadline(noDeadline)
	_ = c.server.nc.SetDeadline(noDeadline)
	if c.srv.adopt(c) {
		return true
	}
	if err := c.server.inRuntimePoller(); err != nil {
		c.log.WithError(err).Warn("cannot serve the session with goroutines")
		return false
	}
	c.relay()
	return false
}

// negotiate answers SSLRequest and GSSENCRequest, serves a CancelRequest, and returns the
// client's StartupMessage packet; nil without error means the connection is done.
func (c *conn) negotiate() ([]byte, error) {
	tlsDone := false
	for {
		packet, err := readStartupPacket(c.client)
		if err != nil {
			return nil, err
		}
		code := binary.BigEndian.Uint32(packet[4:8])
		switch {
		case code == sslRequestCode && len(packet) == 8 && !tlsDone:
			tlsDone = true
			if err := c.startClientTLS(); err != nil {
				return nil, err
			}
		case code == gssEncRequestCode && len(packet) == 8:
			// GSSAPI encryption cannot be terminated by a proxy; the client falls back.
			if _, err := c.client.Write([]byte{sslRefused}); err != nil {
				return nil, err
			}
		case code == cancelRequestCode && len(packet) >= 16:
			c.srv.forwardCancel(c.ctx, packet)
			return nil, nil
		case code>>16 == protocolMajor3:
			return packet, nil
		default:
			c.refuse(sqlstate.FeatureNotSupported, fmt.Sprintf(
				"unsupported frontend protocol %d.%d: server supports 3.0 to 3.2", code>>16, code&0xffff))
			return nil, fmt.Errorf("unsupported startup code %d", code)
		}
	}
}

func (c *conn) startClientTLS() error {
	cfg := c.srv.TLSConfig
	if cfg == nil || (len(cfg.Certificates) == 0 && cfg.GetCertificate == nil && cfg.GetConfigForClient == nil) {
		_, err := c.client.Write([]byte{sslRefused})
		return err
	}
	if _, err := c.client.Write([]byte{sslAccepted}); err != nil {
		return err
	}
	tc := tls.Server(&tlsTransport{Conn: c.client}, cfg)
	if err := tc.HandshakeContext(c.ctx); err != nil {
		return fmt.Errorf("client TLS handshake: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		tc.Close()
		return net.ErrClosed
	}
	c.client = tc
	return nil
}

// connectUpstream dials the upstream and sends it the client's startup packet unchanged, so
// that every parameter the client chose reaches the database in the client's order.
func (c *conn) connectUpstream(packet []byte) error {
	uc, err := c.srv.dialUpstream(c.ctx, c.upstreamAddr)
	if err != nil {
		return err
	}
	sc := newServerConn(uc, c.srv.maxMessageSize())
	if !c.useServer(sc) {
		uc.Close()
		return net.ErrClosed
	}
	return sc.start(packet, time.Now().Add(c.srv.startupTimeout()))
}

// useServer makes sc the session's server connection, reporting false when the session
// was closed meanwhile. The buffers of the authentication exchange, when the proxy ran
// one, serve the session.
func (c *conn) useServer(sc *serverConn) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.server = sc
	c.mu.Unlock()
	if c.cr.br == nil {
		c.cr.br = takeReader(c.client)
	}
	c.cr.maxBody = sc.r.maxBody
	if c.cw == nil {
		c.cw = takeWriter(c.client)
	}
	return true
}

// refuse sends the client a FATAL error of the proxy's own making before any session
// exists.
func (c *conn) refuse(code, message string) { c.refuseDetail(code, message, "") }

// refuseDetail is refuse with a DETAIL field.
func (c *conn) refuseDetail(code, message, detail string) {
	c.srv.reject(code)
	c.log.WithField("code", code).Info(message)
	_, _ = c.client.Write(fatalDetail(code, message, detail))
}

// close closes both connections; it is safe to call from any goroutine, any number of times.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.cancel()
	client, key, session, room := c.client, c.cancelKey, c.session, c.room
	var server net.Conn
	if c.server != nil && !c.serverKept {
		server = c.server.nc
	}
	if c.serverKept {
		room = nil // it went with the server connection
	}
	c.mu.Unlock()

	client.Close()
	if server != nil {
		server.Close()
	}
	if room != nil {
		c.srv.sessionPool.release(*room)
	}
	if key != "" {
		c.srv.cancels.remove(key, c)
	}
	if session {
		c.srv.releaseSession()
	}
	c.srv.forgetConn(c)
}

// holdSession records that the connection holds a session slot, giving the slot back at
// once when the connection was closed meanwhile.
func (c *conn) holdSession() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.srv.releaseSession()
		return false
	}
	c.session = true
	return true
}

// setCancelKey records the server connection's BackendKeyData and registers it as the
// cancel key the client is being given.
func (c *conn) setCancelKey(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.server.key = key
	c.registerCancelKeyLocked(key)
}

// registerCancelKey registers key as the cancel key the client is being given.
func (c *conn) registerCancelKey(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.registerCancelKeyLocked(key)
	}
}

func (c *conn) registerCancelKeyLocked(key string) {
	if c.cancelKey != "" {
		c.srv.cancels.remove(c.cancelKey, c)
	}
	c.cancelKey = key
	c.srv.cancels.add(key, c)
}

// singleGoroutine tells the session's locks whether one goroutine at a time serves it
// (an event loop) or two (a goroutine pair); see sessionLock.
func (c *conn) singleGoroutine(single bool) {
	c.cwMu.single = single
	c.sess.mu.single = single
}

// startupParams returns the name/value pairs of a protocol 3 StartupMessage packet.
func startupParams(packet []byte) map[string]string {
	params := make(map[string]string)
	fields := bytes.Split(packet[8:], []byte{0})
	for i := 0; i+1 < len(fields); i += 2 {
		if len(fields[i]) == 0 {
			break
		}
		params[string(fields[i])] = string(fields[i+1])
	}
	return params
}
