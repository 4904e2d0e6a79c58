package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
)

// errStartupRefused reports that the upstream ended the startup with an ErrorResponse,
// which has been relayed to the client.
var errStartupRefused = errors.New("upstream refused the startup")

// authenticate relays the authentication exchange and the rest of the startup between the
// upstream and the client until the upstream's first ReadyForQuery. The upstream decides:
// the proxy only passes messages along, answers nothing itself, and records the cancel key.
func (c *conn) authenticate() error {
	for {
		typ, n, err := c.ur.next()
		if err != nil {
			return c.upstreamStartupFailed(err)
		}
		switch typ {
		case 'R':
			body, err := c.ur.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			if len(body) < 4 {
				return fmt.Errorf("authentication message of %d bytes", len(body))
			}
			// SASL mechanisms are passed on unchanged, SCRAM-SHA-256-PLUS included:
			// hiding it would not help, since a client able to bind then signals
			// "binding supported but not offered" and the server rejects that as a
			// downgrade. Binding succeeds when the proxy presents the database's own
			// certificate; otherwise clients must use channel_binding=disable.
			code := binary.BigEndian.Uint32(body)
			if err := c.writeClient('R', body); err != nil {
				return err
			}
			if err := c.cw.Flush(); err != nil {
				return err
			}
			if authNeedsResponse(code) {
				if err := c.relayAuthResponse(); err != nil {
					return err
				}
			}
		case 'K':
			body, err := c.ur.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			if len(body) < 8 {
				return fmt.Errorf("BackendKeyData of %d bytes", len(body))
			}
			c.setCancelKey(string(body))
			if err := c.writeClient('K', body); err != nil {
				return err
			}
		case 'E':
			if err := c.relayRaw(typ, n); err != nil {
				return err
			}
			_ = c.cw.Flush()
			return errStartupRefused
		case 'Z':
			body, err := c.ur.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			if len(body) != 1 {
				return fmt.Errorf("ReadyForQuery of %d bytes", len(body))
			}
			if err := c.writeClient('Z', body); err != nil {
				return err
			}
			if err := c.cw.Flush(); err != nil {
				return err
			}
			// Published last: from here on Shutdown may write to the client.
			c.txStatus.Store(uint32(body[0]))
			return nil
		case 'S': // ParameterStatus
			body, err := c.ur.readBody(n)
			if err != nil {
				return c.upstreamStartupFailed(err)
			}
			c.noteParameterStatus(body)
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
	_, _ = c.cw.Write(fatal(codeConnectionFailure, "upstream server closed the connection during startup"))
	_ = c.cw.Flush()
	return fmt.Errorf("reading upstream startup: %w", err)
}

// relayAuthResponse forwards the client's answer to an authentication request.
func (c *conn) relayAuthResponse() error {
	typ, n, err := c.cr.next()
	if err != nil {
		return fmt.Errorf("reading authentication response: %w", err)
	}
	if typ != 'p' {
		_, _ = c.cw.Write(fatal(codeProtocolViolation,
			fmt.Sprintf("expected password response, got message type %q", typ)))
		_ = c.cw.Flush()
		return fmt.Errorf("client sent %q during authentication", typ)
	}
	if err := writeHeader(c.uw, typ, n); err != nil {
		return err
	}
	if err := c.cr.copyBody(c.uw, n); err != nil {
		return err
	}
	return c.uw.Flush()
}

// relayRaw copies one upstream message, whose header has been read, to the client.
func (c *conn) relayRaw(typ byte, n int) error {
	if err := writeHeader(c.cw, typ, n); err != nil {
		return err
	}
	return c.ur.copyBody(c.cw, n)
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
