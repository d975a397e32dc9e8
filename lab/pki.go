package lab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The lab's client certificates: one CA that the API server trusts for
// client certificates (--client-ca-file) and the kubelets trust for the
// API server's calls to them (exec, logs, port-forward), as kubeadm sets a
// cluster up. The same CA signs the API server's serving certificate (see
// servingCert); kubelets serve with certificates they make themselves.

// labCA is the lab's client CA.
type labCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertFile is the CA certificate (PEM).
	CertFile string
}

// pkiDir is where the lab keeps its CA and the API server's client
// certificate for kubelets.
func (s *State) pkiDir() string { return filepath.Join(s.Dir, "pki") }

// newLabCA makes the lab's CA in dir.
func newLabCA(dir string) (*labCA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "tabby-lab-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &labCA{cert: cert, key: key, CertFile: filepath.Join(dir, "ca.crt")}
	if err := writePEM(ca.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return ca, writePEM(filepath.Join(dir, "ca.key"), "EC PRIVATE KEY", kder, 0o600)
}

// loadLabCA reads the CA newLabCA made in dir.
func loadLabCA(dir string) (*labCA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("the lab's CA files hold no PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	return &labCA{cert: cert, key: key, CertFile: filepath.Join(dir, "ca.crt")}, nil
}

// clientCert issues a client certificate for user cn in groups orgs and
// writes it and its key to base.crt and base.key.
func (ca *labCA) clientCert(base, cn string, orgs ...string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("issuing the certificate of %s: %w", cn, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = base+".crt", base+".key"
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, writePEM(keyFile, "EC PRIVATE KEY", kder, 0o600)
}

// servingCert issues a serving certificate naming ips and dnsNames and
// writes it, followed by the CA's certificate, to base.crt and its key to
// base.key: the pair kube-apiserver takes from its --cert-dir instead of
// making a self-signed one (internal/controlplane's apiserver.crt), which clients
// then trust.
func (ca *labCA) servingCert(base, cn string, ips []net.IP, dnsNames []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("issuing the serving certificate of %s: %w", cn, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
	if err := os.MkdirAll(filepath.Dir(base), 0o700); err != nil {
		return err
	}
	if err := writeFileAtomic(base+".crt", chain, 0o644); err != nil {
		return err
	}
	return writePEM(base+".key", "EC PRIVATE KEY", kder, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err)
	}
	return n
}
