package pgauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// Error is an authentication failure to report to the client as a FATAL ErrorResponse.
type Error struct {
	Code    string
	Message string
	Detail  string
	// Log says more for the proxy's log than the client may be told (whether the user
	// exists, which check failed).
	Log string
}

func (e *Error) Error() string {
	if e.Log != "" {
		return e.Message + ": " + e.Log
	}
	return e.Message
}

// PasswordFailed is PostgreSQL's answer to a wrong password, an unknown user or a user
// without a usable secret alike, so that a client cannot tell which it was.
func PasswordFailed(user, why string) *Error {
	return &Error{Code: sqlstate.InvalidPassword,
		Message: fmt.Sprintf("password authentication failed for user %q", user), Log: why}
}

func malformed(format string, args ...any) *Error {
	return &Error{Code: sqlstate.ProtocolViolation, Message: "malformed SCRAM message",
		Detail: fmt.Sprintf(format, args...)}
}

// MockSalt returns the salt a SCRAM exchange shows for a user without a SCRAM secret:
// derived from key and the name, so that it stays the same from one attempt to the next,
// as a real user's does (PostgreSQL's scram_mock_salt).
func MockSalt(key []byte, user string) []byte {
	return hmacSum(key, "mock salt "+user)[:saltLen]
}

// SCRAMServer is the server side of one SCRAM-SHA-256(-PLUS) exchange.
type SCRAMServer struct {
	user    string
	secret  Secret // SCRAM keys; zero StoredKey when mocking
	mock    string // why the exchange must fail whatever the client proves ("" when it may pass)
	binding []byte // tls-server-end-point data of the certificate the client saw; nil without TLS

	gs2Header       string
	clientFirstBare string
	serverFirst     string
	nonce           string
	clientKey       []byte
}

// NewSCRAMServer prepares an exchange for user. secret may be a SCRAM secret or a
// plaintext password (hashed with a fresh salt); nil, or a secret SCRAM cannot use (md5),
// gives an exchange that runs to its end with a salt from mockKey and then fails as a
// wrong password does. binding is the channel binding data of the proxy's certificate
// when the client speaks TLS and SCRAM-SHA-256-PLUS is offered, else nil.
func NewSCRAMServer(user string, secret *Secret, mockKey, binding []byte) *SCRAMServer {
	s := &SCRAMServer{user: user, binding: binding}
	switch {
	case secret == nil:
		s.mock = "no such user, or no password"
	case secret.Kind == SCRAM:
		s.secret = *secret
	case secret.Kind == Plain && secret.Password != "":
		s.secret = NewSCRAMSecret(secret.Password)
	case secret.Kind == Plain:
		s.mock = "empty password"
	default:
		s.mock = "the user has no SCRAM secret, only " + secret.Kind.String()
	}
	if s.mock != "" {
		s.secret = Secret{Kind: SCRAM, Iterations: DefaultIterations, Salt: MockSalt(mockKey, user)}
	}
	return s
}

// Mechanisms returns the SASL mechanisms to offer, in PostgreSQL's order.
func (s *SCRAMServer) Mechanisms() []string {
	if s.binding != nil {
		return []string{MechanismSCRAMPlus, MechanismSCRAM}
	}
	return []string{MechanismSCRAM}
}

// First takes the client's chosen mechanism and client-first-message and returns the
// server-first-message.
func (s *SCRAMServer) First(mechanism string, clientFirst []byte) ([]byte, error) {
	plus := mechanism == MechanismSCRAMPlus
	if mechanism != MechanismSCRAM && (!plus || s.binding == nil) {
		return nil, &Error{Code: sqlstate.ProtocolViolation,
			Message: "client selected an invalid SASL authentication mechanism"}
	}
	msg := string(clientFirst)
	// gs2-header: cbind-flag "," [authzid] ","
	flag, rest, ok := strings.Cut(msg, ",")
	if !ok {
		return nil, malformed("the client's first message has no GS2 header")
	}
	authzid, bare, ok := strings.Cut(rest, ",")
	if !ok {
		return nil, malformed("the client's first message has no GS2 header")
	}
	if authzid != "" {
		return nil, &Error{Code: sqlstate.ProtocolViolation, Message: "client uses authorization identity, but it is not supported"}
	}
	switch {
	case flag == "n":
		if plus {
			return nil, malformed("the client selected SCRAM-SHA-256-PLUS but asked for no channel binding")
		}
	case flag == "y":
		if plus {
			return nil, malformed("the client selected SCRAM-SHA-256-PLUS but asked for no channel binding")
		}
		if s.binding != nil {
			// The client can bind and thinks the server cannot: a downgrade.
			return nil, &Error{Code: sqlstate.ProtocolViolation, Message: "SCRAM channel binding negotiation error",
				Detail: "The client supports SCRAM channel binding but thinks the server does not.  However, this server does support channel binding."}
		}
	case strings.HasPrefix(flag, "p="):
		if !plus {
			return nil, &Error{Code: sqlstate.ProtocolViolation, Message: "channel binding was requested but SCRAM-SHA-256-PLUS was not selected"}
		}
		if flag[2:] != cbindType {
			return nil, &Error{Code: sqlstate.ProtocolViolation, Message: "unsupported SCRAM channel-binding type " + strconv.Quote(flag[2:])}
		}
	default:
		return nil, malformed("unexpected channel-binding flag %q", flag)
	}
	s.gs2Header = flag + "," + authzid + ","
	as, err := attrs(bare)
	if err != nil || len(as) < 2 || as[0][0] != "n" || as[1][0] != "r" {
		return nil, malformed("the client's first message wants n= then r=")
	}
	// n= is ignored, as PostgreSQL does: the user is the startup packet's.
	if !validNonce(as[1][1]) {
		return nil, malformed("the client's nonce is not printable")
	}
	for _, a := range as[2:] {
		if a[0] == "m" {
			return nil, malformed("mandatory extensions are not supported")
		}
	}
	s.clientFirstBare = bare
	s.nonce = as[1][1] + randomNonce()
	s.serverFirst = "r=" + s.nonce + ",s=" + base64.StdEncoding.EncodeToString(s.secret.Salt) +
		",i=" + strconv.Itoa(s.secret.Iterations)
	return []byte(s.serverFirst), nil
}

// Final takes the client-final-message and returns the server-final-message, or the
// error that fails the login.
func (s *SCRAMServer) Final(clientFinal []byte) ([]byte, error) {
	msg := string(clientFinal)
	i := strings.LastIndex(msg, ",p=")
	if i < 0 {
		return nil, malformed("the client's final message has no proof")
	}
	withoutProof, proof64 := msg[:i], msg[i+3:]
	as, err := attrs(withoutProof)
	if err != nil || len(as) < 2 || as[0][0] != "c" || as[1][0] != "r" {
		return nil, malformed("the client's final message wants c= then r=")
	}
	cbind, err := base64.StdEncoding.DecodeString(as[0][1])
	if err != nil {
		return nil, malformed("channel binding data is not base64")
	}
	want := []byte(s.gs2Header)
	if strings.HasPrefix(s.gs2Header, "p=") {
		want = append(want, s.binding...)
	}
	if subtle.ConstantTimeCompare(cbind, want) != 1 {
		if strings.HasPrefix(s.gs2Header, "p=") {
			return nil, &Error{Code: sqlstate.ProtocolViolation, Message: "SCRAM channel binding check failed"}
		}
		return nil, malformed("unexpected SCRAM channel-binding attribute in the client's final message")
	}
	if as[1][1] != s.nonce {
		return nil, malformed("the nonce does not match")
	}
	proof, err := base64.StdEncoding.DecodeString(proof64)
	if err != nil {
		return nil, malformed("the proof is not base64")
	}
	authMessage := s.clientFirstBare + "," + s.serverFirst + "," + withoutProof
	clientKey, ok := proofMatches(s.secret.StoredKey, authMessage, proof)
	if s.mock != "" {
		return nil, PasswordFailed(s.user, s.mock)
	}
	if !ok {
		return nil, PasswordFailed(s.user, "wrong SCRAM proof")
	}
	s.clientKey = clientKey
	sig := hmacSum(s.secret.ServerKey, authMessage)
	return []byte("v=" + base64.StdEncoding.EncodeToString(sig)), nil
}

// Keys returns, after a successful Final, the user's SCRAM secret as the exchange used it
// and the ClientKey the client proved; with them the proxy logs into a server that holds
// the same secret.
func (s *SCRAMServer) Keys() (secret Secret, clientKey []byte) {
	return s.secret, s.clientKey
}

// MD5Challenge is the server side of md5 password authentication.
type MD5Challenge struct {
	user   string
	secret string // md5 secret; "" when the check must fail
	why    string
	Salt   [4]byte
}

// NewMD5Challenge prepares an md5 check of user against secret, which must be md5 or a
// plaintext password; any other (nil included) gives a check that fails.
func NewMD5Challenge(user string, secret *Secret) *MD5Challenge {
	m := &MD5Challenge{user: user}
	_, _ = rand.Read(m.Salt[:])
	switch {
	case secret == nil:
		m.why = "no such user, or no password"
	case secret.Kind == MD5:
		m.secret = secret.MD5
	case secret.Kind == Plain && secret.Password != "":
		m.secret = MD5Secret(secret.Password, user)
	case secret.Kind == Plain:
		m.why = "empty password"
	default:
		m.why = "the user has no md5 secret, only " + secret.Kind.String()
	}
	return m
}

// Check verifies the client's PasswordMessage body (NUL-terminated).
func (m *MD5Challenge) Check(body []byte) error {
	got := strings.TrimSuffix(string(body), "\x00")
	if m.secret == "" {
		return PasswordFailed(m.user, m.why)
	}
	want := md5Response(m.secret, m.Salt[:])
	if !hmac.Equal([]byte(got), []byte(want)) {
		return PasswordFailed(m.user, "wrong md5 password")
	}
	return nil
}
