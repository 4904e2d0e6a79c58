// Package health keeps the last known state of what leafproxy depends on (the upstream
// database, the store), checked in the background, so that /readyz, `leafproxy
// healthcheck` and the status page answer from memory: a probe never waits for a dial,
// and a flood of probes never becomes a flood of connections.
package health

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/leafproxy/leafproxy/internal/keyexchange"
)

// State is what a Probe knows of its dependency.
type State struct {
	Name    string // "upstream", "store"
	Target  string // what is checked, with no credentials (host:port)
	Checked bool   // at least one check has finished
	OK      bool   // the last check succeeded
	// Since is when the current state (OK or not) began; LastCheck when the last check
	// finished.
	Since, LastCheck time.Time
	// LastError is the newest failure, kept after a recovery so an operator sees what
	// happened; LastErrorAt is when it was seen.
	LastError   string
	LastErrorAt time.Time
}

// Problem returns why the dependency is not usable, "" when it is.
func (s State) Problem() string {
	switch {
	case !s.Checked:
		return fmt.Sprintf("%s %s not checked yet", s.Name, s.Target)
	case !s.OK:
		return fmt.Sprintf("%s %s unreachable since %s: %s", s.Name, s.Target,
			s.Since.UTC().Format("15:04:05"), s.LastError)
	}
	return ""
}

// Probe checks one dependency every Interval. Build it as a literal and call Run.
type Probe struct {
	Name   string
	Target string
	// Check returns nil when the dependency answers. It gets a context bounded by Timeout.
	Check func(ctx context.Context) error
	// Interval between checks; 0 means 2 s. Timeout bounds one check; 0 means 5 s.
	Interval, Timeout time.Duration
	// OnChange, when set, is called after a check whose outcome differs from the one
	// before (the first check always counts as a change), with the new state.
	OnChange func(State)

	mu    sync.Mutex
	state State
}

// SetTarget changes what State names as the checked target, for a dependency whose
// address changed (the upstreams after a reload of the databases).
func (p *Probe) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Target = target
}

// State returns the last known state.
func (p *Probe) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state
	st.Name, st.Target = p.Name, p.Target
	return st
}

// Run checks at once, then every Interval, until ctx ends.
func (p *Probe) Run(ctx context.Context) {
	interval := p.Interval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		p.CheckNow(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// CheckNow runs one check and records its outcome.
func (p *Probe) CheckNow(ctx context.Context) {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	err := p.Check(cctx)
	cancel()
	if ctx.Err() != nil {
		return // shutting down: a canceled check says nothing about the dependency
	}
	now := time.Now().UTC() // shown on the status page, which speaks UTC
	p.mu.Lock()
	changed := !p.state.Checked || p.state.OK != (err == nil)
	if changed {
		p.state.Since = now
	}
	p.state.Checked, p.state.OK, p.state.LastCheck = true, err == nil, now
	if err != nil {
		p.state.LastError, p.state.LastErrorAt = OneLine(err.Error()), now
	}
	st := p.state
	st.Name, st.Target = p.Name, p.Target
	p.mu.Unlock()
	if changed && p.OnChange != nil {
		p.OnChange(st)
	}
}

// OneLine folds a multi-line error text (pgconn joins one line per address tried) into
// one line.
func OneLine(s string) string {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\t' })
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	return strings.Join(fields, " ")
}

// sslRequest is the 8-byte SSLRequest packet: length 8, code 80877103.
var sslRequest = func() []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b[0:], 8)
	binary.BigEndian.PutUint32(b[4:], 80877103)
	return b
}()

// probeKeyExchanges remembers the TLS key exchange each probed server chose, as the
// proxy does for its upstream connections (see package keyexchange): a probe every 2 s
// would otherwise pay a second round trip and key shares made in vain against a
// PostgreSQL with its default curve.
var probeKeyExchanges keyexchange.Memory

// DialPostgres checks that a PostgreSQL server answers at addr (host:port, or a Unix
// socket path): it connects, sends an SSLRequest and reads the one-byte answer; after an
// 'S' it completes the TLS handshake (without verifying the certificate: this is a probe,
// not a session) and closes it with a close_notify. That proves a PostgreSQL server is
// listening without logging in, so no credentials are needed, and the server logs
// nothing: it stays silent about a connection that ends before its startup packet, but it
// would log a TLS handshake cut short.
func DialPostgres(ctx context.Context, addr string) error {
	_, err := dialPostgres(ctx, addr)
	return err
}

// dialPostgres is DialPostgres, returning the state of the TLS handshake when there was
// one; the key exchange it offers is probeKeyExchanges' (see keyexchange.Dial).
func dialPostgres(ctx context.Context, addr string) (*tls.ConnectionState, error) {
	return keyexchange.Dial(&probeKeyExchanges, addr, func(offer tls.CurveID) (*tls.ConnectionState, *tls.ConnectionState, error) {
		st, err := dialPostgresOffering(ctx, addr, offer)
		return st, st, err
	})
}

// dialPostgresOffering is one probe, offering the key exchange offer alone in a TLS
// handshake, or every one when offer is 0.
func dialPostgresOffering(ctx context.Context, addr string, offer tls.CurveID) (*tls.ConnectionState, error) {
	network := "tcp"
	if strings.HasPrefix(addr, "/") {
		network = "unix"
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(sslRequest); err != nil {
		return nil, fmt.Errorf("send SSLRequest: %w", err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(c, answer[:]); err != nil {
		return nil, fmt.Errorf("no answer to SSLRequest (is it PostgreSQL?): %w", err)
	}
	switch answer[0] {
	case 'N':
		return nil, nil
	case 'S':
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
		keyexchange.Restrict(cfg, offer)
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, &keyexchange.HandshakeError{Err: fmt.Errorf("TLS handshake: %w", err)}
		}
		st := tc.ConnectionState()
		return &st, tc.Close()
	}
	return nil, fmt.Errorf("answered SSLRequest with %q: not a PostgreSQL server", answer[0])
}
