// Package keyexchange remembers, per PostgreSQL server address, the TLS key exchange the
// server chose, so that later handshakes with it offer that one alone.
//
// A TLS 1.3 client sends its key share for the key exchanges it likes best in its first
// message. Go's are X25519 with ML-KEM-768 and plain X25519, whatever order
// tls.Config.CurvePreferences gives; PostgreSQL up to 17 takes only the curve
// ssl_ecdh_curve names, prime256v1 (P-256) by default, and asks the client to start again
// with a share for it (a HelloRetryRequest). Every connection then pays a second round
// trip and the key shares made in vain: about 200–300 µs of CPU out of 800–900 for the
// handshake. So a Memory keeps, per address, the key exchange its server chose when
// offered them all, and Offer returns that one afterwards. It offers them all again from
// time to time (Relearn), so that a server whose choice has changed is followed, and at
// once when a connection offered the remembered one fails its handshake; then for Relearn
// it learns nothing from that address, whose name may stand for several servers that
// choose differently, so that no more than one connection in that time pays a failed
// handshake.
package keyexchange

import (
	"crypto/tls"
	"errors"
	"sync"
	"time"
)

// Relearn is how long a remembered choice serves before the next connection offers every
// key exchange again.
const Relearn = 5 * time.Minute

// Memory is what is remembered of the servers' choices. The zero value is ready to use.
type Memory struct {
	mu     sync.Mutex
	byAddr map[string]choice
}

// choice is one server's key exchange and when it was chosen; id 0: a connection offered
// the one chosen before failed at that time, and nothing is learned since.
type choice struct {
	id tls.CurveID
	at time.Time
}

// current reports whether c still holds at now.
func (c choice) current(now time.Time) bool { return now.Sub(c.at) < Relearn }

// Offer returns the key exchange to offer alone to the server at addr, or 0 to offer them
// all.
func (m *Memory) Offer(addr string, now time.Time) tls.CurveID {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.byAddr[addr]; ok && c.current(now) {
		return c.id
	}
	return 0
}

// Restrict makes cfg offer the key exchange offer alone; offer 0 leaves cfg offering
// them all.
func Restrict(cfg *tls.Config, offer tls.CurveID) {
	if offer != 0 {
		cfg.CurvePreferences = []tls.CurveID{offer}
	}
}

// Learn remembers that the server at addr chose id when offered every key exchange; id 0
// (no key exchange of the kind, such as TLS 1.2's RSA) is not remembered. Nothing is
// learned for a while after a failure (see Failed).
func (m *Memory) Learn(addr string, id tls.CurveID, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.byAddr[addr]
	switch {
	case ok && c.id == 0 && c.current(now):
		return
	case id == 0:
		delete(m.byAddr, addr)
		return
	}
	if m.byAddr == nil {
		m.byAddr = make(map[string]choice)
	}
	m.byAddr[addr] = choice{id: id, at: now}
}

// Failed notes that a connection to addr offered the key exchange its server chose before
// and failed its handshake: for Relearn, every key exchange is offered and nothing is
// learned.
func (m *Memory) Failed(addr string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byAddr == nil {
		m.byAddr = make(map[string]choice)
	}
	m.byAddr[addr] = choice{at: now}
}

// HandshakeError marks a dial's error as the failure of its TLS handshake (see Dial).
type HandshakeError struct{ Err error }

func (e *HandshakeError) Error() string { return e.Err.Error() }
func (e *HandshakeError) Unwrap() error { return e.Err }

// Dial connects to the server at addr with dial, which offers the key exchange it is given
// alone in its TLS handshake (0: every one; see Restrict) and returns the connection, the
// state of that handshake (nil without TLS), and a *HandshakeError when the handshake
// failed. Dial offers what m remembers for addr and learns from a handshake that offered
// them all; when a handshake offering the remembered one fails, it notes the failure and
// dials again offering them all.
func Dial[C any](m *Memory, addr string, dial func(offer tls.CurveID) (C, *tls.ConnectionState, error)) (C, error) {
	offer := m.Offer(addr, time.Now())
	c, st, err := dial(offer)
	var hs *HandshakeError
	if offer != 0 && errors.As(err, &hs) {
		m.Failed(addr, time.Now())
		offer = 0
		c, st, err = dial(offer)
	}
	if err == nil && st != nil && offer == 0 {
		m.Learn(addr, st.CurveID, time.Now())
	}
	return c, err
}
