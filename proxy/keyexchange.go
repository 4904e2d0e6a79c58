package proxy

import (
	"crypto/tls"
	"sync"
	"time"
)

// A TLS 1.3 client sends its key share for the key exchanges it likes best in its first
// message. Go's are X25519 with ML-KEM-768 and plain X25519; PostgreSQL up to 17 takes
// only the curve ssl_ecdh_curve names, prime256v1 (P-256) by default, and asks the client
// to start again with a share for it (a HelloRetryRequest). Every upstream connection
// then pays a second round trip and the key shares made in vain: about 200–300 µs of the
// proxy's CPU out of 800–900 for the handshake. So the proxy remembers, per upstream
// address, the key exchange its server chose when offered them all, and offers only that
// one afterwards. It offers them all again from time to time (keyExchangeRelearn), so
// that a server whose choice has changed is followed, and at once when a connection
// offered the remembered one fails its handshake; then for keyExchangeRelearn it learns
// nothing from that address, whose name may stand for several servers that choose
// differently, so that no more than one connection in that time pays a failed handshake.

// keyExchangeRelearn is how long a remembered choice serves before the next connection
// offers every key exchange again.
const keyExchangeRelearn = 5 * time.Minute

// keyExchanges is what the proxy remembers of its upstreams' choices.
type keyExchanges struct {
	mu     sync.Mutex
	byAddr map[string]keyExchange
}

// keyExchange is one upstream's choice and when it was made; id 0: a connection
// offered the one chosen before failed at that time, and nothing is learned since.
type keyExchange struct {
	id tls.CurveID
	at time.Time
}

// current reports whether x still holds at now.
func (x keyExchange) current(now time.Time) bool { return now.Sub(x.at) < keyExchangeRelearn }

// offer returns the key exchange to offer alone to the server at addr, or 0 to offer
// them all.
func (k *keyExchanges) offer(addr string, now time.Time) tls.CurveID {
	k.mu.Lock()
	defer k.mu.Unlock()
	if x, ok := k.byAddr[addr]; ok && x.current(now) {
		return x.id
	}
	return 0
}

// learn remembers that the server at addr chose id when offered every key exchange; id
// 0 (no key exchange of the kind, such as TLS 1.2's RSA) is not remembered. Nothing is
// learned for a while after a failure (see failed).
func (k *keyExchanges) learn(addr string, id tls.CurveID, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	x, ok := k.byAddr[addr]
	switch {
	case ok && x.id == 0 && x.current(now):
		return
	case id == 0:
		delete(k.byAddr, addr)
		return
	}
	if k.byAddr == nil {
		k.byAddr = make(map[string]keyExchange)
	}
	k.byAddr[addr] = keyExchange{id: id, at: now}
}

// failed notes that a connection to addr offered the key exchange its server chose
// before and failed its handshake: for keyExchangeRelearn, every key exchange is offered
// and nothing is learned.
func (k *keyExchanges) failed(addr string, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byAddr == nil {
		k.byAddr = make(map[string]keyExchange)
	}
	k.byAddr[addr] = keyExchange{at: now}
}
