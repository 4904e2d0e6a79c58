package pgauth

import (
	"bytes"
	"crypto/hmac"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Authentication request codes of the AuthenticationRequest message.
const (
	AuthOK                = 0
	AuthCleartextPassword = 3
	AuthMD5Password       = 5
	AuthSASL              = 10
	AuthSASLContinue      = 11
	AuthSASLFinal         = 12
)

// Login is the client side of a login to PostgreSQL with what the proxy holds for the
// user: a stored secret and, after a SCRAM exchange with the client, the ClientKey the
// client proved.
type Login struct {
	User   string
	Secret *Secret // nil: no password (the server must trust the user)
	// ClientKey is the SCRAM ClientKey matching Secret (a SCRAM secret); nil when the
	// client has not proved one.
	ClientKey []byte
	// Binding is the tls-server-end-point data of the server's certificate when the
	// connection to it is TLS and binding is possible; nil otherwise.
	Binding []byte
	// TLS says the connection to the server is encrypted (a SCRAM client on TLS that
	// cannot bind says so with the "y" flag).
	TLS bool

	clientKey, storedKey, serverKey []byte
	gs2Header, clientFirstBare      string
	nonce, authMessage              string
	done                            bool
}

// ErrCannotLogin wraps the reasons the proxy cannot answer a server's request with what
// it holds.
var ErrCannotLogin = errors.New("the proxy cannot log in")

func cannot(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCannotLogin, fmt.Sprintf(format, args...))
}

// Respond returns the body of the PasswordMessage (or SASL response) that answers an
// AuthenticationRequest body from the server, or nil when the request needs no answer
// (AuthenticationOk, SASLFinal).
func (l *Login) Respond(body []byte) ([]byte, error) {
	if len(body) < 4 {
		return nil, fmt.Errorf("authentication request of %d bytes", len(body))
	}
	code := binary.BigEndian.Uint32(body)
	data := body[4:]
	switch code {
	case AuthOK:
		if l.gs2Header != "" && !l.done {
			return nil, errors.New("the server accepted the login without proving it knows the SCRAM secret")
		}
		return nil, nil
	case AuthCleartextPassword:
		if l.Secret == nil || l.Secret.Kind != Plain {
			return nil, cannot("the server asks for a cleartext password and the proxy holds %s", l.holds())
		}
		return cstring(l.Secret.Password), nil
	case AuthMD5Password:
		if len(data) != 4 {
			return nil, fmt.Errorf("md5 request with a salt of %d bytes", len(data))
		}
		switch {
		case l.Secret != nil && l.Secret.Kind == MD5:
			return cstring(md5Response(l.Secret.MD5, data)), nil
		case l.Secret != nil && l.Secret.Kind == Plain:
			return cstring(md5Response(MD5Secret(l.Secret.Password, l.User), data)), nil
		}
		return nil, cannot("the server asks for an md5 password and the proxy holds %s", l.holds())
	case AuthSASL:
		return l.saslStart(data)
	case AuthSASLContinue:
		return l.saslContinue(data)
	case AuthSASLFinal:
		return nil, l.saslFinal(data)
	}
	return nil, cannot("the server asks for authentication method %d, which the proxy does not speak", code)
}

// holds names what the proxy has for the user, for error messages.
func (l *Login) holds() string {
	switch {
	case l.Secret == nil:
		return "no password"
	case l.Secret.Kind == SCRAM && l.ClientKey != nil:
		return "SCRAM keys"
	}
	return "a " + l.Secret.Kind.String() + " secret"
}

func cstring(s string) []byte { return append([]byte(s), 0) }

func (l *Login) saslStart(data []byte) ([]byte, error) {
	var mechs []string
	for m := range bytes.SplitSeq(data, []byte{0}) {
		if len(m) > 0 {
			mechs = append(mechs, string(m))
		}
	}
	switch {
	case l.Secret != nil && l.Secret.Kind == Plain:
		// Keys follow from the salt the server sends.
	case l.Secret != nil && l.Secret.Kind == SCRAM && len(l.ClientKey) == keyLen:
		l.clientKey, l.storedKey, l.serverKey = l.ClientKey, l.Secret.StoredKey, l.Secret.ServerKey
	default:
		return nil, cannot("the server asks for SCRAM and the proxy holds %s", l.holds())
	}
	mech := ""
	for _, m := range mechs {
		if m == MechanismSCRAMPlus && l.Binding != nil {
			mech = m
			break
		}
		if m == MechanismSCRAM {
			mech = m
		}
	}
	switch {
	case mech == "":
		return nil, cannot("the server offers SASL mechanisms %q and none the proxy speaks", mechs)
	case mech == MechanismSCRAMPlus:
		l.gs2Header = "p=" + cbindType + ",,"
	case l.TLS:
		l.gs2Header = "y,,"
	default:
		l.gs2Header = "n,,"
	}
	l.nonce = randomNonce()
	l.clientFirstBare = "n=,r=" + l.nonce
	first := l.gs2Header + l.clientFirstBare
	out := append([]byte(mech), 0)
	out = binary.BigEndian.AppendUint32(out, uint32(len(first)))
	return append(out, first...), nil
}

func (l *Login) saslContinue(data []byte) ([]byte, error) {
	if l.gs2Header == "" || l.authMessage != "" {
		return nil, errors.New("unexpected SASLContinue")
	}
	serverFirst := string(data)
	as, err := attrs(serverFirst)
	if err != nil || len(as) < 3 || as[0][0] != "r" || as[1][0] != "s" || as[2][0] != "i" {
		return nil, fmt.Errorf("malformed server-first-message %q", serverFirst)
	}
	nonce := as[0][1]
	if !strings.HasPrefix(nonce, l.nonce) || len(nonce) == len(l.nonce) || !validNonce(nonce) {
		return nil, errors.New("the server's SCRAM nonce does not extend the proxy's")
	}
	salt, err := base64.StdEncoding.DecodeString(as[1][1])
	if err != nil {
		return nil, errors.New("the server's SCRAM salt is not base64")
	}
	iter, err := strconv.Atoi(as[2][1])
	if err != nil || iter < 1 {
		return nil, fmt.Errorf("bad SCRAM iteration count %q", as[2][1])
	}
	if l.Secret.Kind == Plain {
		salted := saltedPassword(l.Secret.Password, salt, iter)
		l.clientKey = hmacSum(salted, "Client Key")
		l.storedKey = sha256Sum(l.clientKey)
		l.serverKey = hmacSum(salted, "Server Key")
	} else if iter != l.Secret.Iterations || !bytes.Equal(salt, l.Secret.Salt) {
		return nil, cannot("the server's SCRAM secret for user %q is not the proxy's (salt or iteration count differ)", l.User)
	}
	cbind := []byte(l.gs2Header)
	if strings.HasPrefix(l.gs2Header, "p=") {
		cbind = append(cbind, l.Binding...)
	}
	withoutProof := "c=" + base64.StdEncoding.EncodeToString(cbind) + ",r=" + nonce
	l.authMessage = l.clientFirstBare + "," + serverFirst + "," + withoutProof
	proof := xorBytes(l.clientKey, hmacSum(l.storedKey, l.authMessage))
	return []byte(withoutProof + ",p=" + base64.StdEncoding.EncodeToString(proof)), nil
}

func (l *Login) saslFinal(data []byte) error {
	if l.authMessage == "" {
		return errors.New("unexpected SASLFinal")
	}
	v, ok := strings.CutPrefix(string(data), "v=")
	if !ok {
		return fmt.Errorf("malformed server-final-message %q", data)
	}
	if i := strings.IndexByte(v, ','); i >= 0 {
		v = v[:i]
	}
	sig, err := base64.StdEncoding.DecodeString(v)
	if err != nil || !hmac.Equal(sig, hmacSum(l.serverKey, l.authMessage)) {
		return errors.New("the server's SCRAM signature is wrong: it does not hold the user's secret")
	}
	l.done = true
	return nil
}
