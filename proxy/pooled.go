package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/proxy/pgauth"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// PoolMode says how sessions get server connections.
type PoolMode string

const (
	// PoolSession gives every session a server connection of its own, for as long as
	// the session lasts (the default).
	PoolSession PoolMode = "session"
	// PoolTransaction lends a session a server connection of a pool for one transaction
	// (or one statement outside a transaction) at a time; see txsession.go.
	PoolTransaction PoolMode = "transaction"
)

// ParsePoolMode parses the pool-mode setting; empty means PoolSession.
func ParsePoolMode(s string) (PoolMode, error) {
	switch PoolMode(s) {
	case "", PoolSession:
		return PoolSession, nil
	case PoolTransaction:
		return PoolTransaction, nil
	}
	return "", fmt.Errorf("unknown pool mode %q (want session or transaction)", s)
}

// pooling is the server's pool of server connections in transaction mode, created at
// the first session that needs it.
type pooling struct {
	mu     sync.Mutex
	closed bool
	// pool is the pool once made: set under mu, and read without it by the borrows.
	pool atomic.Pointer[pool.Pool[*physConn]]
	lot  *parkLot // the parked sessions (park.go); nil before the first
	// bare counts the sessions on event loops that gave their buffers back while quiet
	// (txloop_linux.go): parked too, without a lot.
	bare atomic.Int64

	// targets maps each key to where and how its connections log in (*poolTarget).
	targets sync.Map
}

// poolTarget is where the connections of a pool key go and how they log in: the
// upstream address, the database name there, and the credentials of the last client of
// the key the proxy authenticated itself (its stored secret and, after SCRAM, the
// ClientKey it proved), so that the pool logs in as the user with what a client proved
// and stores no password.
type poolTarget struct {
	addr, database, user string
	// key is the key as first made: every session of the key gets these very strings,
	// which the pool then compares at once, by their pointers, when it looks the key up.
	key pool.Key

	mu        sync.Mutex
	secret    *pgauth.Secret
	clientKey []byte
}

// login returns how a new connection of the target logs in; nil when the proxy does not
// authenticate clients (the upstream must trust the user).
func (t *poolTarget) login() *pgauth.Login {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.secret == nil {
		return nil
	}
	return &pgauth.Login{User: t.user, Secret: t.secret, ClientKey: t.clientKey}
}

// poolKey returns the pool key of a session routed to database at addr for user, and
// records where its connections go and, when the proxy authenticated the client, what
// they log in with. Sessions routed to another upstream than Server.Upstream get a key
// of their own, whose database names the upstream too.
func (s *Server) poolKey(addr, database, user string, front *pgauth.Login) pool.Key {
	key := s.keyOf(addr, database, user)
	v, _ := s.pooling.targets.LoadOrStore(key, &poolTarget{addr: addr, database: database, user: user, key: key})
	t := v.(*poolTarget)
	if front != nil && front.Secret != nil {
		t.mu.Lock()
		t.secret = front.Secret
		if front.ClientKey != nil {
			t.clientKey = front.ClientKey
		}
		t.mu.Unlock()
	}
	return t.key
}

// keyOf returns the pool key of the sessions of user routed to database at addr: on
// another upstream than Server.Upstream, the key's database names the upstream too.
func (s *Server) keyOf(addr, database, user string) pool.Key {
	key := pool.Key{Database: database, User: user}
	if addr != s.Upstream {
		key.Database = database + "@" + addr
	}
	return key
}

// serverPool returns the pool of server connections, creating it on first use.
func (s *Server) serverPool() (*pool.Pool[*physConn], error) {
	if p := s.pooling.pool.Load(); p != nil {
		return p, nil
	}
	s.pooling.mu.Lock()
	defer s.pooling.mu.Unlock()
	if p := s.pooling.pool.Load(); p != nil {
		return p, nil
	}
	if s.pooling.closed {
		return nil, pool.ErrClosed
	}
	p, err := pool.New[*physConn](physConnector{s}, s.poolSettings(s.Pooling))
	if err != nil {
		return nil, err
	}
	s.pooling.pool.Store(p)
	return p, nil
}

// poolSettings fills in what the Server knows of a pool's settings: among them the
// limits of the databases and users of the routing table (see routedLimits).
func (s *Server) poolSettings(settings pool.Settings) pool.Settings {
	if settings.Log == nil {
		settings.Log = s.logger()
	}
	if settings.PerKey == nil {
		settings.PerKey = s.routedLimits
	}
	if settings.PerDatabase == nil {
		settings.PerDatabase = s.routedMaxDB
	}
	if settings.ServerConnectTimeout == 0 {
		settings.ServerConnectTimeout = s.dialTimeout() + s.startupTimeout()
	}
	return settings
}

// existingPool returns the pool of server connections, nil before the first pooled
// session.
func (s *Server) existingPool() *pool.Pool[*physConn] { return s.pooling.pool.Load() }

// PoolStats returns the figures of every pool of server connections (transaction mode);
// nil before the first pooled session.
func (s *Server) PoolStats() []pool.Stats {
	p := s.existingPool()
	if p == nil {
		return nil
	}
	st := p.Snapshot()
	for i := range st {
		st[i].Mode = string(PoolTransaction)
	}
	return st
}

// ReloadPooling applies new pool settings (sizes, timeouts) to a running server: the
// pools in use take them as pool.Pool.Reload says, with the limits of the routing table
// in use (call it after SetRoutes). PoolMode cannot change; the pool modes of a routing
// table apply to the sessions that start after SetRoutes.
func (s *Server) ReloadPooling(settings pool.Settings) error {
	s.pooling.mu.Lock()
	defer s.pooling.mu.Unlock()
	settings = s.poolSettings(settings)
	if p := s.pooling.pool.Load(); p != nil {
		if err := p.Reload(settings); err != nil {
			return err
		}
	}
	s.Pooling = settings
	return nil
}

// closePool closes the pool of server connections, if there is one; none is created
// afterwards.
func (s *Server) closePool() {
	s.pooling.mu.Lock()
	p := s.pooling.pool.Load()
	s.pooling.closed = true
	s.pooling.mu.Unlock()
	if p != nil {
		p.Close()
	}
}

// physConn is a server connection of the pool: logged in as the key's user, idle between
// borrowers, and what the proxy knows of the session state on it.
type physConn struct {
	addr string // the upstream's address, for cancel requests
	nc   net.Conn
	br   *bufio.Reader
	// io is the connection's socket once it has left the runtime's poller for the event
	// loops (see physIO); nil while transaction-mode sessions run on goroutines.
	io  *physIO
	key [8]byte // BackendKeyData: process ID and secret

	// login holds the ParameterStatus values reported at login, by name as the server
	// spells it; they are what a new client is told at its startup.
	login []paramValue
	// loginUser is the session_authorization reported at login. userChanged: params
	// holds another one, so the session user is no longer the one p logged in as. SET
	// SESSION AUTHORIZATION is refused, but set_config can change it too, and the server
	// reports it; such a connection is reset (DISCARD ALL) before it is lent again, lest
	// the next client run as that user. setParam and dropParam keep it.
	loginUser struct {
		value string
		ok    bool
	}
	userChanged bool
	// params holds the values of the settings the proxy tracks as they are now on this
	// connection, by lower-case name: those the server reports, and those the proxy set.
	params map[string]string
	// reported holds the lower-case names the server reports with ParameterStatus.
	reported map[string]bool
	// prepared holds the server-side names of the statements prepared on this connection
	// by the proxy (see pstmtName), most recently used first (see txstmts.go).
	prepared preparedSet
	// unnamed is the client statement the unnamed statement of this connection was last
	// parsed from, nil when unknown.
	unnamed *clientStmt
	// applied: params is what applySettings made of the client settings appliedKey
	// stands for (see pooledConn.settingsKey), and nothing changed them since.
	applied    bool
	appliedKey unique.Handle[string]
}

type paramValue struct{ name, value string }

// physConnector dials, resets and closes the pool's server connections for a Server.
type physConnector struct{ s *Server }

// errUpstreamAuth reports an upstream that wants a password for a pooled login.
var errUpstreamAuth = errors.New("the upstream asks for a password")

func (pc physConnector) Dial(ctx context.Context, key pool.Key) (*physConn, error) {
	v, ok := pc.s.pooling.targets.Load(key)
	if !ok {
		return nil, fmt.Errorf("no upstream known for %s of %s", key.User, key.Database)
	}
	t := v.(*poolTarget)
	nc, err := pc.s.dialUpstream(ctx, t.addr)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(d)
	}
	p := &physConn{
		addr:     t.addr,
		nc:       nc,
		br:       bufio.NewReaderSize(nc, readBufferSize),
		params:   make(map[string]string),
		reported: make(map[string]bool),
	}
	if err := p.logIn(t); err != nil {
		nc.Close()
		return nil, err
	}
	pc.s.noteLogin(key, p.login)
	_ = nc.SetDeadline(noDeadline)
	if pc.s.txOnLoops() {
		if err := p.loopNative(); err != nil {
			nc.Close()
			return nil, err
		}
	}
	return p, nil
}

// setParam notes the value of a setting on p, by lower-case name, and whether it makes
// the session user another than at login.
func (p *physConn) setParam(lname, value string) {
	p.params[lname] = value
	if lname == "session_authorization" {
		p.userChanged = p.loginUser.ok && value != p.loginUser.value
	}
}

// dropParam forgets the value of a setting on p.
func (p *physConn) dropParam(lname string) {
	delete(p.params, lname)
	if lname == "session_authorization" {
		p.userChanged = false
	}
}

// logIn sends the startup packet of the target and reads the server's startup messages
// up to ReadyForQuery, answering the server's authentication requests with the
// credentials of a client the proxy authenticated, or with none (trust).
func (p *physConn) logIn(t *poolTarget) error {
	msg := &pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters:      map[string]string{"user": t.user, "database": t.database},
	}
	packet, err := msg.Encode(nil)
	if err != nil {
		return err
	}
	if _, err := p.nc.Write(packet); err != nil {
		return err
	}
	login := t.login()
	for {
		typ, body, err := p.readMessage()
		if err != nil {
			return err
		}
		switch typ {
		case serverAuthentication:
			if len(body) < 4 {
				return fmt.Errorf("authentication message of %d bytes", len(body))
			}
			code := binary.BigEndian.Uint32(body)
			if login == nil {
				if code != pgproto3.AuthTypeOk {
					return fmt.Errorf("%w (authentication request %d) for user %q: with auth-type passthrough the proxy holds no credentials for pooled logins, so the upstream must trust it",
						errUpstreamAuth, code, t.user)
				}
				continue
			}
			if code != pgproto3.AuthTypeOk && login.Binding == nil {
				login.Binding, login.TLS = connBinding(p.nc)
			}
			resp, err := login.Respond(body)
			if err != nil {
				return err
			}
			if resp != nil {
				if _, err := p.nc.Write(appendMessage(nil, clientPassword, resp)); err != nil {
					return err
				}
			}
		case serverParameterStatus:
			name, value, ok := splitParameterStatus(body)
			if ok {
				p.login = append(p.login, paramValue{name, value})
				if strings.EqualFold(name, "session_authorization") {
					p.loginUser.value, p.loginUser.ok = value, true
				}
				p.setParam(strings.ToLower(name), value)
				p.reported[strings.ToLower(name)] = true
			}
		case serverBackendKeyData:
			if len(body) >= 8 {
				copy(p.key[:], body)
			}
		case serverErrorResponse:
			return upstreamLoginError(body)
		case serverReadyForQuery:
			return nil
		}
	}
}

// upstreamLoginError is the error of a refused pooled login, with the server's SQLSTATE.
func upstreamLoginError(body []byte) error {
	return &pool.Error{Kind: pool.ErrServerDown, Code: string(errorField(body, fieldCode)),
		Cause: errors.New(string(errorField(body, fieldMessage)))}
}

// readMessage reads one whole message of the server.
func (p *physConn) readMessage() (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(p.br, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(h[1:])) - 4
	if n < 0 || n > defaultMaxBodySize {
		return 0, nil, fmt.Errorf("invalid message length %d", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(p.br, body); err != nil {
		return 0, nil, err
	}
	return h[0], body, nil
}

// Reset runs DISCARD ALL and forgets what the proxy knew of the session on the
// connection.
func (pc physConnector) Reset(ctx context.Context, p *physConn) error {
	if d, ok := ctx.Deadline(); ok {
		p.setDeadline(d)
		defer p.setDeadline(noDeadline)
	}
	if _, err := p.nc.Write(appendQuery(nil, "DISCARD ALL")); err != nil {
		return err
	}
	for name := range p.params {
		if !p.reported[name] {
			p.dropParam(name)
		}
	}
	p.prepared.clear()
	p.unnamed = nil
	p.applied = false
	for {
		typ, body, err := p.readMessage()
		if err != nil {
			return err
		}
		switch typ {
		case serverParameterStatus:
			if name, value, ok := splitParameterStatus(body); ok {
				p.setParam(strings.ToLower(name), value)
			}
		case serverErrorResponse:
			return fmt.Errorf("DISCARD ALL failed: %s", errorField(body, fieldMessage))
		case serverReadyForQuery:
			return nil
		}
	}
}

func (physConnector) Close(p *physConn) {
	p.setDeadline(time.Now().Add(time.Second))
	_, _ = p.nc.Write([]byte{clientTerminate, 0, 0, 0, 4})
	p.nc.Close()
	if p.io != nil {
		p.io.Close()
	}
}

// setDeadline sets the deadline of the blocking reads and writes of the connection.
func (p *physConn) setDeadline(d time.Time) {
	_ = p.nc.SetDeadline(d)
	if p.io != nil {
		_ = p.io.SetDeadline(d)
	}
}

// splitParameterStatus returns the name and value of a ParameterStatus body.
func splitParameterStatus(body []byte) (name, value string, ok bool) {
	i := indexZero(body)
	if i < 0 {
		return "", "", false
	}
	j := indexZero(body[i+1:])
	if j < 0 {
		return "", "", false
	}
	return string(body[:i]), string(body[i+1 : i+1+j]), true
}

// indexZero returns the index of the first zero byte of b, -1 if none.
func indexZero(b []byte) int { return bytes.IndexByte(b, 0) }

// appendQuery appends a Query message of sql.
func appendQuery(b []byte, sql string) []byte {
	b = append(b, clientQuery, 0, 0, 0, 0)
	start := len(b) - 4
	b = append(b, sql...)
	b = append(b, 0)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b
}
