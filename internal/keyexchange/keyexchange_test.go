package keyexchange

import (
	"crypto/tls"
	"errors"
	"slices"
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

// TestDial: the first dial to an address offers every key exchange and Dial learns the
// server's choice from it; later dials offer that one alone; a dial without TLS teaches
// nothing; when a handshake offering the remembered one fails, Dial notes it and dials
// again offering them all, and other errors are returned as they are.
func TestDial(t *testing.T) {
	var m Memory
	chosen := tls.CurveP256
	var offers []tls.CurveID
	dial := func(offer tls.CurveID) (string, *tls.ConnectionState, error) {
		offers = append(offers, offer)
		if offer != 0 && offer != chosen {
			return "", nil, &HandshakeError{Err: errors.New("no shared group")}
		}
		return "conn", &tls.ConnectionState{CurveID: chosen}, nil
	}
	for range 2 {
		if c, err := Dial(&m, "db:5432", dial); c != "conn" || err != nil {
			t.Fatalf("Dial = %q, %v", c, err)
		}
	}
	chosen = tls.X25519
	if c, err := Dial(&m, "db:5432", dial); c != "conn" || err != nil {
		t.Fatalf("after the server's change: Dial = %q, %v", c, err)
	}
	if want := []tls.CurveID{0, tls.CurveP256, tls.CurveP256, 0}; !slices.Equal(offers, want) {
		t.Errorf("offers %v, want %v", offers, want)
	}

	plain := func(tls.CurveID) (string, *tls.ConnectionState, error) { return "plain", nil, nil }
	if c, err := Dial(&m, "other:5432", plain); c != "plain" || err != nil || m.Offer("other:5432", time.Now()) != 0 {
		t.Errorf("without TLS: Dial = %q, %v; offer %v", c, err, m.Offer("other:5432", time.Now()))
	}
	refused := errors.New("connection refused")
	calls := 0
	down := func(tls.CurveID) (string, *tls.ConnectionState, error) { calls++; return "", nil, refused }
	m.Learn("down:5432", tls.CurveP256, time.Now())
	if _, err := Dial(&m, "down:5432", down); !errors.Is(err, refused) || calls != 1 {
		t.Errorf("a dial that fails before the handshake: %v after %d calls, want it at once", err, calls)
	}
}
