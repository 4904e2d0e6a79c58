package pgauth

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"hash"
	"strings"
)

// SASL mechanisms.
const (
	MechanismSCRAM     = "SCRAM-SHA-256"
	MechanismSCRAMPlus = "SCRAM-SHA-256-PLUS"
)

// DefaultIterations is PostgreSQL's scram_iterations default.
const DefaultIterations = 4096

const (
	keyLen   = sha256.Size
	nonceLen = 18 // random bytes of a nonce, as PostgreSQL's SCRAM_RAW_NONCE_LEN
	saltLen  = 16
	// cbindType is the only channel binding type PostgreSQL knows.
	cbindType = "tls-server-end-point"
)

func hmacSum(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func sha256Sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

// saltedPassword is SCRAM's SaltedPassword of a plaintext password, prepared as
// PostgreSQL prepares it (see saslPrep).
func saltedPassword(password string, salt []byte, iterations int) []byte {
	key, err := pbkdf2.Key(sha256.New, saslPrep(password), salt, iterations, keyLen)
	if err != nil {
		// Only a FIPS-140 mode restriction makes this fail; a short password is not
		// worth crashing over, and the login simply fails.
		return make([]byte, keyLen)
	}
	return key
}

func xorBytes(a, b []byte) []byte {
	out := make([]byte, len(a))
	for i := range a {
		out[i] = a[i] ^ b[i]
	}
	return out
}

// randomNonce makes the random part of a nonce; tests replace it.
var randomNonce = newNonce

func newNonce() string {
	b := make([]byte, nonceLen)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// EndPointHash returns the tls-server-end-point channel binding data of a certificate
// (RFC 5929 §4.1): its hash by the hash function of its signature algorithm, SHA-256 for
// MD5 and SHA-1. ok is false when the algorithm names no usable hash (Ed25519, for one),
// where PostgreSQL cannot bind either.
func EndPointHash(cert *x509.Certificate) (sum []byte, ok bool) {
	var h hash.Hash
	switch cert.SignatureAlgorithm {
	case x509.MD5WithRSA, x509.SHA1WithRSA, x509.ECDSAWithSHA1, x509.DSAWithSHA1,
		x509.SHA256WithRSA, x509.SHA256WithRSAPSS, x509.ECDSAWithSHA256, x509.DSAWithSHA256:
		h = sha256.New()
	case x509.SHA384WithRSA, x509.SHA384WithRSAPSS, x509.ECDSAWithSHA384:
		h = sha512.New384()
	case x509.SHA512WithRSA, x509.SHA512WithRSAPSS, x509.ECDSAWithSHA512:
		h = sha512.New()
	default:
		return nil, false
	}
	h.Write(cert.Raw)
	return h.Sum(nil), true
}

// attrs splits a SCRAM message into its attributes, in order.
func attrs(msg string) ([][2]string, error) {
	var out [][2]string
	for part := range strings.SplitSeq(msg, ",") {
		if len(part) < 2 || part[1] != '=' {
			return nil, fmt.Errorf("malformed attribute %q", part)
		}
		out = append(out, [2]string{part[:1], part[2:]})
	}
	return out, nil
}

// validNonce reports whether s is a printable nonce without commas (RFC 5802 §7).
func validNonce(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}

// proofMatches reports whether proof proves knowledge of the ClientKey behind storedKey
// for this AuthMessage, and returns that ClientKey.
func proofMatches(storedKey []byte, authMessage string, proof []byte) ([]byte, bool) {
	if len(proof) != keyLen {
		return nil, false
	}
	clientKey := xorBytes(proof, hmacSum(storedKey, authMessage))
	return clientKey, subtle.ConstantTimeCompare(sha256Sum(clientKey), storedKey) == 1
}
