// Package pgauth is PostgreSQL password authentication on both sides of a proxy: the
// server side, which checks a client against a stored secret (SCRAM-SHA-256 with and
// without channel binding, md5), and the client side, which logs into PostgreSQL with
// that secret or with the SCRAM ClientKey recovered from the client's own proof, so that
// the proxy never needs a plaintext password.
//
// The package knows the content of the authentication messages, not the framing: callers
// read and write the messages and pass their bodies in and out.
package pgauth

import (
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
)

// Kind is the format a secret is stored in.
type Kind int

// Secret formats, as PostgreSQL stores them in pg_authid.rolpassword and as PgBouncer's
// auth_file accepts them.
const (
	// Plain is a plaintext password (auth_file only; PostgreSQL never stores one).
	Plain Kind = iota
	// MD5 is "md5" followed by the hex MD5 of the password and the user name.
	MD5
	// SCRAM is SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>.
	SCRAM
)

func (k Kind) String() string {
	switch k {
	case MD5:
		return "md5"
	case SCRAM:
		return "SCRAM-SHA-256"
	}
	return "plaintext"
}

// Secret is a user's stored password in one of PostgreSQL's formats.
type Secret struct {
	Kind Kind
	// Password is the plaintext (Plain).
	Password string
	// MD5 is the whole stored string, "md5" and 32 hex digits (MD5).
	MD5 string
	// Iterations, Salt, StoredKey and ServerKey are the parts of a SCRAM secret.
	Iterations int
	Salt       []byte
	StoredKey  []byte
	ServerKey  []byte
}

// ParseSecret reads a stored secret the way PostgreSQL tells them apart: a valid SCRAM
// secret is SCRAM, "md5" with 32 hex digits is md5, anything else is a plaintext password.
func ParseSecret(s string) Secret {
	if sec, ok := parseSCRAMSecret(s); ok {
		return sec
	}
	if isMD5Secret(s) {
		return Secret{Kind: MD5, MD5: s}
	}
	return Secret{Kind: Plain, Password: s}
}

func isMD5Secret(s string) bool {
	if len(s) != 35 || !strings.HasPrefix(s, "md5") {
		return false
	}
	_, err := hex.DecodeString(s[3:])
	return err == nil
}

func parseSCRAMSecret(s string) (Secret, bool) {
	rest, ok := strings.CutPrefix(s, "SCRAM-SHA-256$")
	if !ok {
		return Secret{}, false
	}
	params, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return Secret{}, false
	}
	iter, salt64, ok := strings.Cut(params, ":")
	if !ok {
		return Secret{}, false
	}
	stored64, server64, ok := strings.Cut(keys, ":")
	if !ok {
		return Secret{}, false
	}
	n, err := strconv.Atoi(iter)
	if err != nil || n < 1 {
		return Secret{}, false
	}
	salt, err1 := base64.StdEncoding.DecodeString(salt64)
	stored, err2 := base64.StdEncoding.DecodeString(stored64)
	server, err3 := base64.StdEncoding.DecodeString(server64)
	if err1 != nil || err2 != nil || err3 != nil || len(salt) == 0 ||
		len(stored) != keyLen || len(server) != keyLen {
		return Secret{}, false
	}
	return Secret{Kind: SCRAM, Iterations: n, Salt: salt, StoredKey: stored, ServerKey: server}, true
}

// SCRAMSecret returns the secret PostgreSQL would store for password with this salt and
// iteration count.
func SCRAMSecret(password string, salt []byte, iterations int) Secret {
	salted := saltedPassword(password, salt, iterations)
	clientKey := hmacSum(salted, "Client Key")
	return Secret{
		Kind:       SCRAM,
		Iterations: iterations,
		Salt:       append([]byte(nil), salt...),
		StoredKey:  sha256Sum(clientKey),
		ServerKey:  hmacSum(salted, "Server Key"),
	}
}

// NewSCRAMSecret returns a SCRAM secret of password with a new random salt and
// PostgreSQL's default iteration count, as PostgreSQL makes one for a new password.
func NewSCRAMSecret(password string) Secret {
	salt := make([]byte, saltLen)
	_, _ = rand.Read(salt)
	return SCRAMSecret(password, salt, DefaultIterations)
}

// String returns the secret in its stored form.
func (s Secret) String() string {
	switch s.Kind {
	case MD5:
		return s.MD5
	case SCRAM:
		enc := base64.StdEncoding.EncodeToString
		return "SCRAM-SHA-256$" + strconv.Itoa(s.Iterations) + ":" + enc(s.Salt) + "$" +
			enc(s.StoredKey) + ":" + enc(s.ServerKey)
	}
	return s.Password
}

// MD5Secret returns the md5 secret of a password and user: "md5" and hex(md5(password+user)).
func MD5Secret(password, user string) string {
	sum := md5.Sum([]byte(password + user))
	return "md5" + hex.EncodeToString(sum[:])
}

// md5Response is what a client answers to AuthenticationMD5Password with salt, given the
// stored md5 secret: "md5" and hex(md5(hex part of the secret + salt)).
func md5Response(secret string, salt []byte) string {
	sum := md5.Sum(append([]byte(secret[3:]), salt...))
	return "md5" + hex.EncodeToString(sum[:])
}
