package pgauth

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// RFC 7677 §3: user "user", password "pencil".
const (
	rfcClientNonce = "rOprNGfwEbeRWgbNEkqO"
	rfcServerPart  = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	rfcSalt        = "W22ZaJ0SNY7soEsUEjb6gQ=="
	rfcClientFirst = "n,,n=user,r=" + rfcClientNonce
	rfcServerFirst = "r=" + rfcClientNonce + rfcServerPart + ",s=" + rfcSalt + ",i=4096"
	rfcFinalNoPf   = "c=biws,r=" + rfcClientNonce + rfcServerPart
	rfcProof       = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
	rfcServerFinal = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
)

func withNonce(t *testing.T, nonce string) {
	t.Helper()
	old := randomNonce
	randomNonce = func() string { return nonce }
	t.Cleanup(func() { randomNonce = old })
}

func rfcSecret(t *testing.T) Secret {
	salt, err := base64.StdEncoding.DecodeString(rfcSalt)
	if err != nil {
		t.Fatal(err)
	}
	return SCRAMSecret("pencil", salt, 4096)
}

// TestSCRAMServerRFC7677 runs the server side through RFC 7677's exchange and checks
// every message, and that the ClientKey recovered from the proof is the password's.
func TestSCRAMServerRFC7677(t *testing.T) {
	withNonce(t, rfcServerPart)
	secret := rfcSecret(t)
	stored := ParseSecret(secret.String())
	if stored.Kind != SCRAM || !bytes.Equal(stored.StoredKey, secret.StoredKey) {
		t.Fatalf("secret %q does not parse back", secret)
	}
	s := NewSCRAMServer("user", &stored, []byte("k"), nil)
	first, err := s.First(MechanismSCRAM, []byte(rfcClientFirst))
	if err != nil {
		t.Fatal(err)
	}
	if string(first) != rfcServerFirst {
		t.Fatalf("server-first\n got %s\nwant %s", first, rfcServerFirst)
	}
	final, err := s.Final([]byte(rfcFinalNoPf + ",p=" + rfcProof))
	if err != nil {
		t.Fatal(err)
	}
	if string(final) != rfcServerFinal {
		t.Fatalf("server-final %s, want %s", final, rfcServerFinal)
	}
	_, clientKey := s.Keys()
	salt, _ := base64.StdEncoding.DecodeString(rfcSalt)
	if want := hmacSum(saltedPassword("pencil", salt, 4096), "Client Key"); !bytes.Equal(clientKey, want) {
		t.Fatalf("recovered ClientKey %x, want %x", clientKey, want)
	}
	// The recovered key proves the same exchange again: ClientProof = ClientKey XOR
	// HMAC(StoredKey, AuthMessage).
	authMessage := "n=user,r=" + rfcClientNonce + "," + rfcServerFirst + "," + rfcFinalNoPf
	proof := xorBytes(clientKey, hmacSum(secret.StoredKey, authMessage))
	if got := base64.StdEncoding.EncodeToString(proof); got != rfcProof {
		t.Fatalf("proof from the recovered key %s, want %s", got, rfcProof)
	}
}

func TestSCRAMServerWrongProof(t *testing.T) {
	withNonce(t, rfcServerPart)
	secret := rfcSecret(t)
	s := NewSCRAMServer("user", &secret, []byte("k"), nil)
	if _, err := s.First(MechanismSCRAM, []byte(rfcClientFirst)); err != nil {
		t.Fatal(err)
	}
	bad := []byte(rfcProof)
	bad[0] ^= 1
	_, err := s.Final([]byte(rfcFinalNoPf + ",p=" + string(bad)))
	wantCode(t, err, sqlstate.InvalidPassword)
	if !strings.Contains(err.Error(), `password authentication failed for user "user"`) {
		t.Fatalf("error %q", err)
	}
}

func wantCode(t *testing.T, err error, code string) *Error {
	t.Helper()
	var ae *Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T), want *Error with %s", err, err, code)
	}
	if ae.Code != code {
		t.Fatalf("error %q has code %s, want %s", ae.Message, ae.Code, code)
	}
	return ae
}

// exchange runs a Login against a SCRAMServer the way the proxy relays them.
func exchange(t *testing.T, l *Login, s *SCRAMServer) error {
	t.Helper()
	var offer []byte
	for _, m := range s.Mechanisms() {
		offer = append(append(offer, m...), 0)
	}
	offer = append(offer, 0)
	initial, err := l.Respond(authBody(AuthSASL, offer))
	if err != nil {
		return err
	}
	i := bytes.IndexByte(initial, 0)
	mech, data := string(initial[:i]), initial[i+5:]
	if n := binary.BigEndian.Uint32(initial[i+1:]); int(n) != len(data) {
		t.Fatalf("SASLInitialResponse says %d bytes, holds %d", n, len(data))
	}
	first, err := s.First(mech, data)
	if err != nil {
		return err
	}
	final, err := l.Respond(authBody(AuthSASLContinue, first))
	if err != nil {
		return err
	}
	sfinal, err := s.Final(final)
	if err != nil {
		return err
	}
	if resp, err := l.Respond(authBody(AuthSASLFinal, sfinal)); err != nil || resp != nil {
		return errors.Join(err, errors.New("SASLFinal got an answer"))
	}
	_, err = l.Respond(authBody(AuthOK, nil))
	return err
}

func authBody(code uint32, data []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, code), data...)
}

// TestLoginWithRecoveredKey authenticates a client with its password at one SCRAM server
// (the proxy), then logs into a second (the database) with the ClientKey recovered there.
func TestLoginWithRecoveredKey(t *testing.T) {
	secret := SCRAMSecret("pencil", []byte("0123456789abcdef"), 4096)
	front := NewSCRAMServer("user", &secret, []byte("k"), nil)
	if err := exchange(t, &Login{User: "user", Secret: &Secret{Kind: Plain, Password: "pencil"}}, front); err != nil {
		t.Fatal(err)
	}
	held, clientKey := front.Keys()
	upstream := NewSCRAMServer("user", &secret, []byte("k"), nil)
	if err := exchange(t, &Login{User: "user", Secret: &held, ClientKey: clientKey}, upstream); err != nil {
		t.Fatal(err)
	}

	// A database whose secret has another salt refuses the key; the proxy says why
	// before sending a proof.
	other := SCRAMSecret("pencil", []byte("fedcba9876543210"), 4096)
	err := exchange(t, &Login{User: "user", Secret: &held, ClientKey: clientKey},
		NewSCRAMServer("user", &other, []byte("k"), nil))
	if !errors.Is(err, ErrCannotLogin) {
		t.Fatalf("login against another salt: %v, want ErrCannotLogin", err)
	}
	// A wrong key fails at the database.
	wrong := append([]byte(nil), clientKey...)
	wrong[0] ^= 1
	err = exchange(t, &Login{User: "user", Secret: &held, ClientKey: wrong}, NewSCRAMServer("user", &secret, []byte("k"), nil))
	wantCode(t, err, sqlstate.InvalidPassword)
}

func TestSCRAMChannelBinding(t *testing.T) {
	secret := SCRAMSecret("pencil", []byte("0123456789abcdef"), 4096)
	plain := &Secret{Kind: Plain, Password: "pencil"}
	binding := bytes.Repeat([]byte{7}, 32)

	s := NewSCRAMServer("user", &secret, []byte("k"), binding)
	if got := s.Mechanisms(); len(got) != 2 || got[0] != MechanismSCRAMPlus {
		t.Fatalf("mechanisms %q, want PLUS first", got)
	}
	if err := exchange(t, &Login{User: "user", Secret: plain, Binding: binding, TLS: true}, s); err != nil {
		t.Fatalf("binding to the same certificate: %v", err)
	}

	other := bytes.Repeat([]byte{8}, 32)
	err := exchange(t, &Login{User: "user", Secret: plain, Binding: other, TLS: true},
		NewSCRAMServer("user", &secret, []byte("k"), binding))
	if ae := wantCode(t, err, sqlstate.ProtocolViolation); ae.Message != "SCRAM channel binding check failed" {
		t.Fatalf("message %q", ae.Message)
	}

	// A TLS client that cannot bind says "y"; a server that offers binding calls that
	// a downgrade.
	err = exchange(t, &Login{User: "user", Secret: plain, TLS: true},
		NewSCRAMServer("user", &secret, []byte("k"), binding))
	if ae := wantCode(t, err, sqlstate.ProtocolViolation); ae.Message != "SCRAM channel binding negotiation error" {
		t.Fatalf("message %q", ae.Message)
	}
	// Without TLS to the proxy, no binding is offered and "n" passes.
	if err := exchange(t, &Login{User: "user", Secret: plain},
		NewSCRAMServer("user", &secret, []byte("k"), nil)); err != nil {
		t.Fatal(err)
	}
}

// TestSCRAMMock: a user without a usable secret goes through the whole exchange, with
// the same salt every time, and fails as a wrong password does.
func TestSCRAMMock(t *testing.T) {
	md5 := ParseSecret(MD5Secret("pencil", "user"))
	for name, secret := range map[string]*Secret{"unknown": nil, "md5 only": &md5, "empty": {Kind: Plain}} {
		t.Run(name, func(t *testing.T) {
			s := NewSCRAMServer("user", secret, []byte("k"), nil)
			err := exchange(t, &Login{User: "user", Secret: &Secret{Kind: Plain, Password: "pencil"}}, s)
			wantCode(t, err, sqlstate.InvalidPassword)
			again := NewSCRAMServer("user", secret, []byte("k"), nil)
			if !bytes.Equal(s.secret.Salt, again.secret.Salt) {
				t.Fatal("mock salt changes between attempts")
			}
		})
	}
}

func TestMD5(t *testing.T) {
	// PostgreSQL's stored form for password "pencil" and user "user".
	stored := MD5Secret("pencil", "user")
	if stored != "md520c46e3762c864548e296b33c3406aa9" {
		t.Fatalf("md5 secret %q", stored)
	}
	for name, secret := range map[string]Secret{"md5": ParseSecret(stored), "plain": ParseSecret("pencil")} {
		t.Run(name, func(t *testing.T) {
			m := NewMD5Challenge("user", &secret)
			for _, held := range []Secret{ParseSecret(stored), {Kind: Plain, Password: "pencil"}} {
				l := &Login{User: "user", Secret: &held}
				resp, err := l.Respond(authBody(AuthMD5Password, m.Salt[:]))
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Check(resp); err != nil {
					t.Fatalf("held %s: %v", held.Kind, err)
				}
			}
			l := &Login{User: "user", Secret: &Secret{Kind: Plain, Password: "wrong"}}
			resp, _ := l.Respond(authBody(AuthMD5Password, m.Salt[:]))
			wantCode(t, m.Check(resp), sqlstate.InvalidPassword)
		})
	}
	scram := SCRAMSecret("pencil", []byte("salt"), 4096)
	m := NewMD5Challenge("user", &scram)
	l := &Login{User: "user", Secret: &Secret{Kind: Plain, Password: "pencil"}}
	resp, _ := l.Respond(authBody(AuthMD5Password, m.Salt[:]))
	wantCode(t, m.Check(resp), sqlstate.InvalidPassword)
	// A SCRAM secret cannot answer an md5 request.
	if _, err := (&Login{User: "user", Secret: &scram}).Respond(authBody(AuthMD5Password, []byte("salt"))); !errors.Is(err, ErrCannotLogin) {
		t.Fatalf("md5 with a SCRAM secret: %v", err)
	}
}

func TestParseSecret(t *testing.T) {
	for in, want := range map[string]Kind{
		"md5e55e2f1ac22f2b7cc4a7ecdd1ec3f2a4":                              MD5,
		"md5e55e2f1ac22f2b7cc4a7ecdd1ec3f2a":                               Plain, // one digit short
		"md5e55e2f1ac22f2b7cc4a7ecdd1ec3f2ag":                              Plain,
		"SCRAM-SHA-256$4096:c2FsdA==$" + strings.Repeat("A", 43) + "=:xyz": Plain,
		rfcSecretString():                                                  SCRAM,
		"pencil":                                                           Plain,
	} {
		if got := ParseSecret(in).Kind; got != want {
			t.Errorf("ParseSecret(%q) is %s, want %s", in, got, want)
		}
	}
}

func rfcSecretString() string {
	salt, _ := base64.StdEncoding.DecodeString(rfcSalt)
	return SCRAMSecret("pencil", salt, 4096).String()
}

func TestParseAuthFile(t *testing.T) {
	users, err := ParseAuthFile(`; PgBouncer's comment
# and another
"alice" "md5e55e2f1ac22f2b7cc4a7ecdd1ec3f2a4"
  "bob"	"pass ""word"""  trailing words are ignored
"we""ird" ""

"alice" "plain"
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := users["alice"]; got.Kind != Plain || got.Password != "plain" {
		t.Errorf("alice: %+v (the later line wins)", got)
	}
	if got := users["bob"]; got.Password != `pass "word"` {
		t.Errorf("bob: %q", got.Password)
	}
	if got, ok := users[`we"ird`]; !ok || got.Password != "" {
		t.Errorf(`we"ird: %+v %v`, got, ok)
	}
	for _, bad := range []string{`alice "x"`, `"alice" x`, `"alice`, `"alice" "x`, `"alice"`, `"" "x"`} {
		if _, err := ParseAuthFile(bad); err == nil {
			t.Errorf("ParseAuthFile(%q) accepted it", bad)
		}
	}
	if q := QuoteAuthField(`a"b`); q != `"a""b"` {
		t.Errorf("QuoteAuthField: %s", q)
	}
}
