package pgauth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

func selfSigned(t *testing.T, key crypto.Signer, alg x509.SignatureAlgorithm) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "proxy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		SignatureAlgorithm: alg,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestEndPointHash checks RFC 5929 §4.1: the certificate's own signature hash, SHA-256 in
// place of MD5 and SHA-1, and no binding where the algorithm names no hash.
func TestEndPointHash(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)

	c256 := selfSigned(t, p256, x509.ECDSAWithSHA256)
	want256 := sha256.Sum256(c256.Raw)
	if got, ok := EndPointHash(c256); !ok || !bytes.Equal(got, want256[:]) {
		t.Errorf("ECDSA-SHA256: %x %v", got, ok)
	}
	c384 := selfSigned(t, p384, x509.ECDSAWithSHA384)
	want384 := sha512.Sum384(c384.Raw)
	if got, ok := EndPointHash(c384); !ok || !bytes.Equal(got, want384[:]) {
		t.Errorf("ECDSA-SHA384: %x %v", got, ok)
	}
	// Go no longer signs with SHA-1; the rule only reads the algorithm and the bytes.
	old := &x509.Certificate{Raw: c256.Raw, SignatureAlgorithm: x509.SHA1WithRSA}
	if got, ok := EndPointHash(old); !ok || !bytes.Equal(got, want256[:]) {
		t.Errorf("SHA1WithRSA: %x %v, want SHA-256", got, ok)
	}
	if _, ok := EndPointHash(selfSigned(t, edKey, x509.PureEd25519)); ok {
		t.Error("Ed25519 gave a binding")
	}
}
