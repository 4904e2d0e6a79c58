package keyexchange

import (
	"crypto/tls"
	"testing"
	"time"
)

// TestMemory checks what is offered after what was learned: the choice of
// the address's server alone, until Relearn has passed; after a failure, all
// of them, and nothing learned, for Relearn.
func TestMemory(t *testing.T) {
	var k Memory
	now := time.Now()
	if got := k.Offer("db:5432", now); got != 0 {
		t.Fatalf("offer before any handshake = %v, want 0 (all)", got)
	}
	k.Learn("db:5432", tls.CurveP256, now)
	if got := k.Offer("db:5432", now.Add(Relearn-time.Second)); got != tls.CurveP256 {
		t.Fatalf("offer = %v, want P-256", got)
	}
	if got := k.Offer("other:5432", now); got != 0 {
		t.Fatalf("offer to another address = %v, want 0 (all)", got)
	}
	if got := k.Offer("db:5432", now.Add(Relearn)); got != 0 {
		t.Fatalf("offer after %v = %v, want 0 (all)", Relearn, got)
	}
	k.Learn("db:5432", tls.CurveP256, now)
	k.Failed("db:5432", now)
	if got := k.Offer("db:5432", now); got != 0 {
		t.Fatalf("offer after a failure = %v, want 0 (all)", got)
	}
	k.Learn("db:5432", tls.X25519, now.Add(time.Second))
	if got := k.Offer("db:5432", now.Add(time.Second)); got != 0 {
		t.Fatalf("offer after a failure and a handshake = %v, want 0 (all)", got)
	}
	k.Learn("db:5432", tls.X25519, now.Add(Relearn))
	if got := k.Offer("db:5432", now.Add(Relearn)); got != tls.X25519 {
		t.Fatalf("offer %v after a failure = %v, want X25519", Relearn, got)
	}
	k.Learn("db:5432", tls.CurveP256, now)
	k.Learn("db:5432", 0, now) // TLS 1.2's RSA key exchange: nothing to offer alone
	if got := k.Offer("db:5432", now); got != 0 {
		t.Fatalf("offer after a handshake without a key exchange = %v, want 0 (all)", got)
	}
}
