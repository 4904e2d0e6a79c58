package proxy

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/leafproxy/leafproxy/internal/keyexchange"
)

// SSLMode says whether and how the proxy encrypts its connections to the upstream
// database. The values and their meaning are libpq's sslmode.
type SSLMode string

// The supported upstream SSL modes.
const (
	// SSLDisable never uses TLS.
	SSLDisable SSLMode = "disable"
	// SSLPrefer uses TLS when the server offers it, without verifying its certificate,
	// and plain TCP otherwise. It is the default, as in libpq.
	SSLPrefer SSLMode = "prefer"
	// SSLRequire insists on TLS but does not verify the server's certificate.
	SSLRequire SSLMode = "require"
	// SSLVerifyFull insists on TLS with a certificate that chains to UpstreamRootCAs
	// (the system roots when nil) and names the upstream host (or UpstreamServerName).
	SSLVerifyFull SSLMode = "verify-full"
)

// ErrUpstreamNoTLS is returned when the upstream refuses TLS although the SSL mode
// requires it.
var ErrUpstreamNoTLS = errors.New("upstream server does not support SSL, but SSL was required")

// ParseSSLMode returns the SSLMode named s; "" means SSLPrefer.
func ParseSSLMode(s string) (SSLMode, error) {
	switch m := SSLMode(s); m {
	case "":
		return SSLPrefer, nil
	case SSLDisable, SSLPrefer, SSLRequire, SSLVerifyFull:
		return m, nil
	}
	return "", fmt.Errorf("unknown sslmode %q (want disable, prefer, require or verify-full)", s)
}

// upstreamNetwork returns the network to dial: a path is a Unix socket, as in libpq's host.
func upstreamNetwork(addr string) string {
	if strings.HasPrefix(addr, "/") {
		return "unix"
	}
	return "tcp"
}

// dialUpstream connects to the upstream database at addr and negotiates TLS per the SSL
// mode.
func (s *Server) dialUpstream(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.dialTimeout())
	defer cancel()
	return keyexchange.Dial(&s.keyExchanges, addr, func(offer tls.CurveID) (net.Conn, *tls.ConnectionState, error) {
		c, err := s.dialUpstreamOffering(ctx, addr, offer)
		if tc, ok := c.(*tls.Conn); ok {
			st := tc.ConnectionState()
			return c, &st, err
		}
		return c, nil, err
	})
}

// dialUpstreamOffering is dialUpstream, offering the key exchange offer alone in a TLS
// handshake, or every one when offer is 0.
func (s *Server) dialUpstreamOffering(ctx context.Context, addr string, offer tls.CurveID) (net.Conn, error) {
	d := net.Dialer{}
	network := upstreamNetwork(addr)
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	mode, err := ParseSSLMode(string(s.UpstreamSSLMode))
	if err != nil {
		c.Close()
		return nil, err
	}
	if mode == SSLDisable || network == "unix" {
		return c, nil
	}
	tc, err := s.startUpstreamTLS(ctx, c, mode, addr, offer)
	if err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

func (s *Server) startUpstreamTLS(ctx context.Context, c net.Conn, mode SSLMode, addr string, offer tls.CurveID) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
		defer c.SetDeadline(noDeadline)
	}
	var req [8]byte
	binary.BigEndian.PutUint32(req[0:], 8)
	binary.BigEndian.PutUint32(req[4:], sslRequestCode)
	if _, err := c.Write(req[:]); err != nil {
		return nil, err
	}
	// Exactly one byte: anything after it would be unencrypted data injected before the
	// handshake.
	var resp [1]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return nil, fmt.Errorf("reading the upstream's answer to SSLRequest: %w", err)
	}
	switch resp[0] {
	case sslAccepted:
	case sslRefused:
		if mode == SSLPrefer {
			return c, nil
		}
		return nil, ErrUpstreamNoTLS
	default:
		return nil, fmt.Errorf("upstream answered SSLRequest with %q", resp[0])
	}
	cfg := s.upstreamTLSConfig(mode, addr)
	keyexchange.Restrict(cfg, offer)
	tc := tls.Client(&tlsTransport{Conn: c}, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, &keyexchange.HandshakeError{Err: fmt.Errorf("TLS handshake with upstream: %w", err)}
	}
	return tc, nil
}

func (s *Server) upstreamTLSConfig(mode SSLMode, addr string) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if mode != SSLVerifyFull {
		// libpq's prefer and require encrypt without authenticating the server.
		cfg.InsecureSkipVerify = true
		return cfg
	}
	cfg.RootCAs = s.UpstreamRootCAs
	cfg.ServerName = s.UpstreamServerName
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	return cfg
}
