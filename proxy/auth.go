package proxy

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// errStartupRefused reports that the upstream ended the startup with an ErrorResponse,
// which has been relayed to the client.
var errStartupRefused = errors.New("upstream refused the startup")

// authenticate relays the authentication exchange and the rest of the startup between the
// upstream and the client until the upstream's first ReadyForQuery. The upstream decides:
// the proxy only passes messages along, answers nothing itself, and records the cancel key.
// When the proxy has authenticated the client itself (c.front is set), it answers the
// upstream's authentication requests instead, and relays only AuthenticationOk and what
// follows it.
func (c *conn) authenticate() error {
	for {
		typ, n, err := c.server.r.next()
		if err != nil {
			return c.upstreamStartupFailed(err)
		}
		switch typ {
		case serverAuthentication:
			body, err := c.server.r.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			if len(body) < 4 {
				return fmt.Errorf("authentication message of %d bytes", len(body))
			}
			if c.front != nil {
				// The proxy has authenticated the client and logs in itself.
				if err := c.loginStep(body); err != nil {
					return err
				}
				continue
			}
			code := binary.BigEndian.Uint32(body)
			if code == pgproto3.AuthTypeSASL && !c.channelBindingPasses() {
				body = withoutMechanism(body, mechanismSCRAMPlus)
			}
			if err := c.writeClient(serverAuthentication, body); err != nil {
				return err
			}
			if err := c.cw.Flush(); err != nil {
				return err
			}
			if authNeedsResponse(code) {
				if err := c.relayAuthResponse(code); err != nil {
					return err
				}
			}
		case serverBackendKeyData:
			body, err := c.server.r.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			if len(body) < 8 {
				return fmt.Errorf("BackendKeyData of %d bytes", len(body))
			}
			c.setCancelKey(string(body))
			if err := c.writeClient(serverBackendKeyData, body); err != nil {
				return err
			}
		case serverErrorResponse:
			if err := c.relayRaw(typ, n); err != nil {
				return err
			}
			_ = c.cw.Flush()
			return errStartupRefused
		case serverReadyForQuery:
			body, err := c.server.r.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			if len(body) != 1 {
				return fmt.Errorf("ReadyForQuery of %d bytes", len(body))
			}
			if err := c.writeClient(serverReadyForQuery, body); err != nil {
				return err
			}
			if err := c.cw.Flush(); err != nil {
				return err
			}
			// Published last: from here on Shutdown may write to the client.
			c.server.txStatus.Store(uint32(body[0]))
			return nil
		case serverParameterStatus:
			body, err := c.server.r.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			c.noteParameterStatus(body)
			if c.reuse != nil {
				c.server.recordParameter(body) // for the clients of later sessions
			}
			if err := c.writeClient(typ, body); err != nil {
				return err
			}
		default:
			// NoticeResponse, NegotiateProtocolVersion.
			if err := c.relayRaw(typ, n); err != nil {
				return err
			}
		}
	}
}

// upstreamStartupFailed tells the client that the upstream went away during startup.
func (c *conn) upstreamStartupFailed(err error) error {
	_, _ = c.cw.Write(fatal(sqlstate.ConnectionFailure, "upstream server closed the connection during startup"))
	_ = c.cw.Flush()
	return fmt.Errorf("reading upstream startup: %w", err)
}

// relayAuthResponse forwards the client's answer to an authentication request of this code.
func (c *conn) relayAuthResponse(code uint32) error {
	typ, n, err := c.cr.next()
	if err != nil {
		return fmt.Errorf("reading authentication response: %w", err)
	}
	if typ != clientPassword {
		_, _ = c.cw.Write(fatal(sqlstate.ProtocolViolation,
			fmt.Sprintf("expected password response, got message type %q", typ)))
		_ = c.cw.Flush()
		return fmt.Errorf("client sent %q during authentication", typ)
	}
	if code == pgproto3.AuthTypeSASL && n <= maxAuthTokenLength {
		return c.relaySASLInitialResponse(n)
	}
	if err := writeHeader(c.server.w, typ, n); err != nil {
		return err
	}
	if err := c.cr.copyBody(c.server.w, n); err != nil {
		return err
	}
	return c.server.w.Flush()
}

// relayRaw copies one upstream message, whose header has been read, to the client.
func (c *conn) relayRaw(typ byte, n int) error {
	if err := writeHeader(c.cw, typ, n); err != nil {
		return err
	}
	return c.server.r.copyBody(c.cw, n)
}

// writeClient writes one message to the client's buffer.
func (c *conn) writeClient(typ byte, body []byte) error {
	if err := writeHeader(c.cw, typ, len(body)); err != nil {
		return err
	}
	_, err := c.cw.Write(body)
	return err
}

// authNeedsResponse reports whether the client answers an Authentication request of this
// code. GSSAPI and SSPI continuations are not relayed: they may or may not get an answer,
// and a proxy cannot take part in Kerberos anyway.
func authNeedsResponse(code uint32) bool {
	switch code {
	case pgproto3.AuthTypeCleartextPassword, pgproto3.AuthTypeMD5Password,
		pgproto3.AuthTypeSASL, pgproto3.AuthTypeSASLContinue:
		return true
	}
	return false
}

// maxAuthTokenLength is the largest authentication message PostgreSQL accepts
// (PG_MAX_AUTH_TOKEN_LENGTH); a larger one is streamed to the server, which refuses it,
// rather than held by the proxy before the client has authenticated.
const maxAuthTokenLength = 65535

// SASL mechanisms of PostgreSQL's SCRAM authentication.
const (
	mechanismSCRAM     = "SCRAM-SHA-256"
	mechanismSCRAMPlus = "SCRAM-SHA-256-PLUS"
)

// channelBindingPasses reports whether SCRAM channel binding can succeed through the
// proxy. The client binds to the certificate of the TLS endpoint it talks to, the server
// to its own: the two only agree when the client speaks TLS to the proxy and the proxy
// presents the database's own certificate. A client that speaks plaintext to the proxy
// cannot bind at all, and libpq refuses a PLUS offer over a plaintext connection.
func (c *conn) channelBindingPasses() bool {
	if _, ok := c.client.(*tls.Conn); !ok {
		return false
	}
	up, ok := c.server.nc.(*tls.Conn)
	if !ok {
		return false
	}
	peer := up.ConnectionState().PeerCertificates
	cfg := c.srv.TLSConfig
	// With several certificates or a callback the proxy cannot tell cheaply which one
	// the client got; only a single, fixed certificate is compared.
	if len(peer) == 0 || cfg == nil || len(cfg.Certificates) != 1 ||
		cfg.GetCertificate != nil || cfg.GetConfigForClient != nil {
		return false
	}
	own := cfg.Certificates[0].Certificate
	return len(own) > 0 && bytes.Equal(own[0], peer[0].Raw)
}

// withoutMechanism returns an AuthenticationSASL body (code, then NUL-terminated mechanism
// names, then an empty name) without the named mechanism.
func withoutMechanism(body []byte, name string) []byte {
	out := make([]byte, 4, len(body))
	copy(out, body[:4])
	rest := body[4:]
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			// Malformed: pass the tail on for the client to judge.
			return append(out, rest...)
		}
		if mech := rest[:i]; string(mech) != name {
			out = append(out, rest[:i+1]...)
		}
		rest = rest[i+1:]
	}
	return out
}

// relaySASLInitialResponse forwards the client's SASLInitialResponse, whose header has
// been read, after checking what it says about channel binding. A client that speaks TLS
// to the proxy and was not offered SCRAM-SHA-256-PLUS answers "y" (binding supported,
// server does not offer it); a server on TLS itself rejects that as a downgrade with an
// obscure error, so the proxy refuses it first and says why. (libpq, with sslmode=prefer,
// then retries without TLS and logs in.)
func (c *conn) relaySASLInitialResponse(n int) error {
	body, err := c.cr.readBody(n)
	if err != nil {
		return fmt.Errorf("reading SASLInitialResponse: %w", err)
	}
	if mech, data, ok := parseSASLInitialResponse(body); ok && mech == mechanismSCRAM &&
		len(data) > 0 && data[0] == 'y' && c.upstreamTLS() {
		msg := &pgproto3.ErrorResponse{
			Severity:            severityFatal,
			SeverityUnlocalized: severityFatal,
			Code:                sqlstate.InvalidAuthorizationSpecification,
			Message:             "SCRAM channel binding cannot pass through the proxy: the client's TLS connection ends at the proxy, not at the database server",
			Hint:                "Connect with channel_binding=disable, or without TLS to the proxy.",
		}
		b, _ := msg.Encode(nil)
		c.srv.reject(sqlstate.InvalidAuthorizationSpecification)
		_, _ = c.cw.Write(b)
		_ = c.cw.Flush()
		return errors.New("client asked for SCRAM channel binding, which cannot pass through the proxy")
	}
	if err := c.writeUpstream(clientPassword, body); err != nil {
		return err
	}
	return c.server.w.Flush()
}

// upstreamTLS reports whether the upstream connection is encrypted.
func (c *conn) upstreamTLS() bool {
	_, ok := c.server.nc.(*tls.Conn)
	return ok
}

// parseSASLInitialResponse splits a SASLInitialResponse body into its mechanism name and
// its initial client response (nil when absent: length -1).
func parseSASLInitialResponse(body []byte) (mech string, data []byte, ok bool) {
	i := bytes.IndexByte(body, 0)
	if i < 0 || len(body) < i+5 {
		return "", nil, false
	}
	mech = string(body[:i])
	l := int32(binary.BigEndian.Uint32(body[i+1:]))
	rest := body[i+5:]
	if l < 0 {
		return mech, nil, true
	}
	if int(l) > len(rest) {
		return "", nil, false
	}
	return mech, rest[:l], true
}

// writeUpstream writes one message to the upstream's buffer.
func (c *conn) writeUpstream(typ byte, body []byte) error {
	if err := writeHeader(c.server.w, typ, len(body)); err != nil {
		return err
	}
	_, err := c.server.w.Write(body)
	return err
}
