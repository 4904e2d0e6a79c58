package proxy

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy/pgauth"
)

// AuthType says who authenticates clients: the database (AuthPassthrough) or the proxy.
type AuthType string

// The authentication types, named as PgBouncer's auth_type.
const (
	// AuthPassthrough relays the authentication exchange: the database decides.
	AuthPassthrough AuthType = "passthrough"
	// AuthSCRAM makes the proxy check clients with SCRAM-SHA-256 (and -PLUS over its
	// own TLS).
	AuthSCRAM AuthType = "scram-sha-256"
	// AuthMD5 makes the proxy check clients with md5, or with SCRAM when the user's
	// stored secret is a SCRAM secret.
	AuthMD5 AuthType = "md5"
	// AuthTrust lets every client in without a password (the database still decides
	// whether the proxy may log in as the user).
	AuthTrust AuthType = "trust"
)

// ParseAuthType returns the AuthType named s; "" means AuthPassthrough.
func ParseAuthType(s string) (AuthType, error) {
	switch t := AuthType(s); t {
	case "":
		return AuthPassthrough, nil
	case AuthPassthrough, AuthSCRAM, AuthMD5, AuthTrust:
		return t, nil
	}
	return "", fmt.Errorf("unknown auth type %q (want passthrough, scram-sha-256, md5 or trust)", s)
}

// DefaultAuthQuery is the query that reads a user's secret, as PgBouncer's default.
const DefaultAuthQuery = "SELECT usename, passwd FROM pg_shadow WHERE usename=$1"

// ClientAuth makes the proxy authenticate clients itself and then log into the database
// as the client's user with what the client proved: the SCRAM ClientKey recovered from its
// proof, or the stored secret. Only when the database accepts that login does the client
// get AuthenticationOk, so the proxy never lets in a client the database would refuse; a
// client served by a connection already logged in as its user (a pool's, or one an
// earlier session left) relies on that connection's login.
type ClientAuth struct {
	// Type is how clients are authenticated; AuthPassthrough (or "") disables the rest.
	Type AuthType
	// File is a PgBouncer auth_file ("user" "secret" lines) holding users' secrets; it
	// is read again whenever it changes. A user found there is not looked up by Query.
	File string
	// User, when set, looks up secrets with Query on the upstream, logged in as User in
	// the database the client asks for.
	User string
	// Query reads a user's name and secret given the name as $1 (DefaultAuthQuery).
	Query string
	// Password is User's password; when empty, File's secret for User is used, and
	// without one the proxy logs in as User with no password.
	Password string

	mu      sync.Mutex
	stamp   fileStamp
	users   map[string]pgauth.Secret
	mockKey []byte
	derived map[string]derivedSecret // by user: SCRAM secrets made from plaintext passwords
}

// derivedSecret is the SCRAM secret the proxy made from a user's plaintext password.
type derivedSecret struct {
	password string
	secret   pgauth.Secret
}

// maxDerivedSecrets bounds ClientAuth.derived; past it the map starts again empty.
const maxDerivedSecrets = 4096

type fileStamp struct {
	mod  time.Time
	size int64
}

// enabled reports whether the proxy authenticates clients.
func (a *ClientAuth) enabled() bool {
	return a != nil && a.Type != "" && a.Type != AuthPassthrough
}

func (a *ClientAuth) query() string {
	if a.Query != "" {
		return a.Query
	}
	return DefaultAuthQuery
}

// fileSecret returns the secret File holds for user, reading the file again when it has
// changed since the last time.
func (a *ClientAuth) fileSecret(user string) (*pgauth.Secret, error) {
	if a.File == "" {
		return nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	fi, err := os.Stat(a.File)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	if st := (fileStamp{fi.ModTime(), fi.Size()}); a.users == nil || st != a.stamp {
		data, err := os.ReadFile(a.File)
		if err != nil {
			return nil, fmt.Errorf("auth file: %w", err)
		}
		users, err := pgauth.ParseAuthFile(string(data))
		if err != nil {
			return nil, fmt.Errorf("auth file %s: %w", a.File, err)
		}
		a.users, a.stamp = users, st
	}
	if s, ok := a.users[user]; ok {
		return &s, nil
	}
	return nil, nil
}

// mock returns the key the salts of unknown users are derived from, made once per
// process.
func (a *ClientAuth) mock() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mockKey == nil {
		a.mockKey = make([]byte, 32)
		_, _ = rand.Read(a.mockKey)
	}
	return a.mockKey
}

// scramSecret returns the SCRAM secret of user's plaintext password: made once, with a
// random salt and PostgreSQL's default iteration count, and kept as long as the password
// stays the same, so that a user with a plaintext secret costs the proxy one key
// derivation (4,096 rounds of HMAC-SHA-256) when the password is first used, not one per
// login, and shows the same salt at every login, as a stored secret does.
func (a *ClientAuth) scramSecret(user, password string) *pgauth.Secret {
	a.mu.Lock()
	d, ok := a.derived[user]
	a.mu.Unlock()
	if ok && d.password == password {
		return &d.secret
	}
	d = derivedSecret{password: password, secret: pgauth.NewSCRAMSecret(password)}
	a.mu.Lock()
	if a.derived == nil || len(a.derived) >= maxDerivedSecrets {
		a.derived = make(map[string]derivedSecret)
	}
	a.derived[user] = d
	a.mu.Unlock()
	return &d.secret
}

// CheckAuthFile reads an auth file, for a configuration check at start.
func CheckAuthFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, err = pgauth.ParseAuthFile(string(data))
	return err
}

// authenticateClient authenticates the client at the proxy when the server is set up to,
// before any upstream connection exists, and leaves in c.front what the proxy logs into
// the database with. It reports false when the connection is done (the client has been
// told why).
func (c *conn) authenticateClient(params map[string]string) bool {
	a := c.srv.Auth
	if !a.enabled() {
		return true
	}
	c.cr = msgReader{br: takeReader(c.client), maxBody: maxAuthTokenLength}
	c.cw = takeWriter(c.client)
	user := params["user"]
	if user == "" {
		c.refuse(sqlstate.InvalidAuthorizationSpecification, "no PostgreSQL user name specified in startup packet")
		return false
	}
	database := params["database"]
	if database == "" {
		database = user
	}
	login, err := c.checkClient(a, user, database)
	if err != nil {
		var ae *pgauth.Error
		if !errors.As(err, &ae) {
			c.log.WithError(err).Debug("authentication did not complete")
			return false
		}
		c.srv.reject(ae.Code)
		c.log.WithField("code", ae.Code).WithField("why", ae.Log).Info(ae.Message)
		_, _ = c.cw.Write(fatalDetail(ae.Code, ae.Message, ae.Detail))
		_ = c.cw.Flush()
		return false
	}
	if c.cr.br.Buffered() > 0 {
		// The client may send nothing before AuthenticationOk.
		c.refuse(sqlstate.ProtocolViolation, "unexpected message during authentication")
		return false
	}
	c.front = login
	return true
}

// checkClient runs the exchange of the configured type with the client and returns how
// the proxy logs into the database as user.
func (c *conn) checkClient(a *ClientAuth, user, database string) (*pgauth.Login, error) {
	secret, err := a.fileSecret(user)
	if err != nil {
		c.log.WithError(err).Error("cannot read the auth file")
		return nil, &pgauth.Error{Code: sqlstate.ConnectionFailure, Message: "the proxy cannot read its auth file", Log: err.Error()}
	}
	if a.Type == AuthTrust {
		return &pgauth.Login{User: user, Secret: secret}, nil
	}
	if secret == nil && a.User != "" {
		secret, err = c.querySecret(a, user, database)
		if err != nil {
			c.log.WithError(err).Warn("auth query failed")
			return nil, &pgauth.Error{Code: sqlstate.ConnectionUnable,
				Message: "could not look up the user's password on the upstream server", Log: err.Error()}
		}
	}
	if a.Type == AuthMD5 && (secret == nil || secret.Kind != pgauth.SCRAM) {
		return c.checkMD5(user, secret)
	}
	return c.checkSCRAM(a, user, secret)
}

func (c *conn) checkMD5(user string, secret *pgauth.Secret) (*pgauth.Login, error) {
	m := pgauth.NewMD5Challenge(user, secret)
	req := binary.BigEndian.AppendUint32(nil, pgauth.AuthMD5Password)
	if err := c.sendAuth(append(req, m.Salt[:]...)); err != nil {
		return nil, err
	}
	body, err := c.readPassword()
	if err != nil {
		return nil, err
	}
	if err := m.Check(body); err != nil {
		return nil, err
	}
	return &pgauth.Login{User: user, Secret: secret}, nil
}

func (c *conn) checkSCRAM(a *ClientAuth, user string, secret *pgauth.Secret) (*pgauth.Login, error) {
	checked := secret
	if secret != nil && secret.Kind == pgauth.Plain && secret.Password != "" {
		checked = a.scramSecret(user, secret.Password)
	}
	s := pgauth.NewSCRAMServer(user, checked, a.mock(), c.clientBinding())
	req := binary.BigEndian.AppendUint32(nil, pgauth.AuthSASL)
	for _, m := range s.Mechanisms() {
		req = append(append(req, m...), 0)
	}
	if err := c.sendAuth(append(req, 0)); err != nil {
		return nil, err
	}
	body, err := c.readPassword()
	if err != nil {
		return nil, err
	}
	mech, data, ok := parseSASLInitialResponse(body)
	if !ok || data == nil {
		return nil, &pgauth.Error{Code: sqlstate.ProtocolViolation, Message: "malformed SASLInitialResponse message"}
	}
	first, err := s.First(mech, data)
	if err != nil {
		return nil, err
	}
	if err := c.sendAuth(append(binary.BigEndian.AppendUint32(nil, pgauth.AuthSASLContinue), first...)); err != nil {
		return nil, err
	}
	if body, err = c.readPassword(); err != nil {
		return nil, err
	}
	final, err := s.Final(body)
	if err != nil {
		return nil, err
	}
	if err := c.sendAuth(append(binary.BigEndian.AppendUint32(nil, pgauth.AuthSASLFinal), final...)); err != nil {
		return nil, err
	}
	if secret != nil && secret.Kind == pgauth.Plain {
		return &pgauth.Login{User: user, Secret: secret}, nil
	}
	held, clientKey := s.Keys()
	return &pgauth.Login{User: user, Secret: &held, ClientKey: clientKey}, nil
}

// sendAuth sends the client an Authentication message.
func (c *conn) sendAuth(body []byte) error {
	if err := c.writeClient(serverAuthentication, body); err != nil {
		return err
	}
	return c.cw.Flush()
}

// readPassword reads the client's next message, which must be a password message (the
// type of every answer to an Authentication request).
func (c *conn) readPassword() ([]byte, error) {
	typ, n, err := c.cr.next()
	if err != nil {
		return nil, fmt.Errorf("reading authentication response: %w", err)
	}
	if typ != clientPassword {
		return nil, &pgauth.Error{Code: sqlstate.ProtocolViolation,
			Message: fmt.Sprintf("expected password response, got message type %q", typ)}
	}
	body, err := c.cr.readBody(n)
	if err != nil {
		return nil, fmt.Errorf("reading authentication response: %w", err)
	}
	return append([]byte(nil), body...), nil
}

// clientBinding returns the channel binding data of the certificate the proxy presents to
// a TLS client, or nil when the client is not on TLS or the certificate is not known for
// sure (several certificates, a callback) or cannot be bound to.
func (c *conn) clientBinding() []byte {
	if _, ok := c.client.(*tls.Conn); !ok {
		return nil
	}
	cfg := c.srv.TLSConfig
	if cfg == nil || len(cfg.Certificates) != 1 || cfg.GetCertificate != nil || cfg.GetConfigForClient != nil {
		return nil
	}
	return certBinding(cfg.Certificates[0].Leaf, cfg.Certificates[0].Certificate)
}

// connBinding returns the channel binding data of the certificate of the server at the
// other end of nc, nil when nc is not TLS; and whether nc is TLS.
func connBinding(nc net.Conn) (binding []byte, isTLS bool) {
	up, ok := nc.(*tls.Conn)
	if !ok {
		return nil, false
	}
	peer := up.ConnectionState().PeerCertificates
	if len(peer) == 0 {
		return nil, true
	}
	return certBinding(peer[0], nil), true
}

func certBinding(leaf *x509.Certificate, chain [][]byte) []byte {
	if leaf == nil {
		if len(chain) == 0 {
			return nil
		}
		var err error
		if leaf, err = x509.ParseCertificate(chain[0]); err != nil {
			return nil
		}
	}
	sum, ok := pgauth.EndPointHash(leaf)
	if !ok {
		return nil
	}
	return sum
}

// loginStep answers an Authentication request of the upstream with what the proxy holds
// for the client (c.front). AuthenticationOk goes on to the client, which learns only now
// that it is in; every other request stays between the proxy and the upstream.
func (c *conn) loginStep(body []byte) error {
	if len(body) < 4 {
		return fmt.Errorf("authentication message of %d bytes", len(body))
	}
	if binary.BigEndian.Uint32(body) == pgauth.AuthOK {
		if _, err := c.front.Respond(body); err != nil {
			return c.loginFailed(err)
		}
		if err := c.writeClient(serverAuthentication, body); err != nil {
			return err
		}
		return c.cw.Flush()
	}
	if c.front.Binding == nil {
		c.front.Binding, c.front.TLS = connBinding(c.server.nc)
	}
	resp, err := c.front.Respond(body)
	if err != nil {
		return c.loginFailed(err)
	}
	if resp == nil {
		return nil
	}
	if err := c.writeUpstream(clientPassword, resp); err != nil {
		return err
	}
	return c.server.w.Flush()
}

// loginFailed tells the client that the proxy could not log into the database for it.
func (c *conn) loginFailed(err error) error {
	c.srv.reject(sqlstate.InvalidAuthorizationSpecification)
	msg := fmt.Sprintf("the proxy could not log into the database server as user %q", c.front.User)
	c.log.WithError(err).Warn(msg)
	_, _ = c.cw.Write(fatalDetail(sqlstate.InvalidAuthorizationSpecification, msg, err.Error()))
	_ = c.cw.Flush()
	return fmt.Errorf("upstream login: %w", err)
}
