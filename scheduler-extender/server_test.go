package extender

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// selfSigned writes a certificate for 127.0.0.1 and its key to dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tabby-scheduler-extender"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// start serves cfg on a free port until the test ends and returns the address.
func start(t *testing.T, cfg Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.Scheduler == nil {
		cfg.Scheduler = testScheduler()
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, ln, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

func TestHTTPS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	addr := start(t, Config{TLSCertFile: certFile, TLSKeyFile: keyFile})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	resp, err := client.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "ok" || resp.TLS == nil {
		t.Fatalf("healthz: %d %q tls=%v", resp.StatusCode, body, resp.TLS != nil)
	}

	args := mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(testNodes()...)})
	resp, err = client.Post("https://"+addr+"/filter", "application/json", bytes.NewReader(args))
	if err != nil {
		t.Fatal(err)
	}
	var res extenderv1.ExtenderFilterResult
	err = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(res.Nodes.Items) != 2 {
		t.Fatalf("filter over HTTPS: %d %v %+v", resp.StatusCode, err, res)
	}

	// Plain HTTP to the HTTPS port is refused.
	resp, err = (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP was served on the HTTPS port")
		}
	}
}

func TestPlainHTTP(t *testing.T) {
	addr := start(t, Config{})
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "go_goroutines") {
		t.Fatalf("metrics: %d", resp.StatusCode)
	}
}

func TestTLSConfigErrors(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t, t.TempDir())
	ctx := context.Background()
	if err := Run(ctx, Config{Scheduler: testScheduler(), Listen: "127.0.0.1:0", TLSCertFile: certFile}); err == nil || !strings.Contains(err.Error(), "both") {
		t.Errorf("cert without key: %v", err)
	}
	if err := Run(ctx, Config{Scheduler: testScheduler(), Listen: "127.0.0.1:0", TLSCertFile: keyFile, TLSKeyFile: certFile}); err == nil || !strings.Contains(err.Error(), "loading the TLS certificate") {
		t.Errorf("swapped files: %v", err)
	}
	if err := Run(ctx, Config{Scheduler: testScheduler(), Listen: "127.0.0.1:0", TLSCertFile: "/nonexistent.crt", TLSKeyFile: keyFile}); err == nil {
		t.Error("missing cert file: no error")
	}
}

// testCA is a CA that signs client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client returns a client certificate for cn that ca signed.
func (ca *testCA) client(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientCertificates: with --client-ca-file, a client without a
// certificate is refused (401, before its body is read) on every route but
// /healthz, one whose certificate another CA signed fails the handshake,
// and one with a certificate the CA signed is answered.
func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, serverPool := selfSigned(t, dir)
	ca, rogue := newTestCA(t, "scheduler clients"), newTestCA(t, "someone else")
	caFile := filepath.Join(dir, "client-ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := start(t, Config{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: caFile})
	url := "https://" + addr
	clientWith := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: serverPool, Certificates: certs}}}
	}
	body := filterBody(t)

	anonymous := clientWith()
	for _, path := range []string{"/filter", "/prioritize"} {
		resp, err := anonymous.Post(url+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(msg), "--client-ca-file") {
			t.Errorf("%s without a client certificate: %d %q; want 401 naming --client-ca-file", path, resp.StatusCode, msg)
		}
	}
	if resp, err := anonymous.Get(url + "/metrics"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics without a client certificate: %v %v", resp, err)
	}
	if resp, err := anonymous.Get(url + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz (the kubelet's probes) without a client certificate: %v %v", resp, err)
	}

	// Go's client leaves out a certificate the server's CA list does not
	// name (it is then anonymous, as above); present it regardless.
	rogueCert := rogue.client(t, "kube-scheduler")
	forced := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: serverPool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &rogueCert, nil }}}}
	if resp, err := forced.Post(url+"/filter", "application/json", bytes.NewReader(body)); err == nil {
		resp.Body.Close()
		t.Errorf("a client certificate another CA signed: %d; want the handshake refused", resp.StatusCode)
	} else {
		t.Logf("a certificate another CA signed: %v", err)
	}

	code, answer := postFilter(t, clientWith(ca.client(t, "kube-scheduler")), url, body)
	if code != http.StatusOK {
		t.Errorf("a client certificate the CA signed: %d %s", code, answer)
	}
}

func TestClientCAErrors(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	ctx := context.Background()
	if err := Run(ctx, Config{Scheduler: testScheduler(), Listen: "127.0.0.1:0", ClientCAFile: certFile}); err == nil || !strings.Contains(err.Error(), "--tls-cert-file") {
		t.Errorf("a client CA without HTTPS: %v", err)
	}
	notPEM := filepath.Join(dir, "ca.txt")
	_ = os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	if err := Run(ctx, Config{Scheduler: testScheduler(), Listen: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: notPEM}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a client CA file without a certificate: %v", err)
	}
}

// --profiling serves Go's profiles on the extender's own mux; without it
// there are none.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		mux := NewMux(Config{Scheduler: testScheduler(), Profiling: on}, prometheus.NewRegistry())
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1"} {
			w := do(mux, http.MethodGet, path, "", nil)
			if want := map[bool]int{false: 404, true: 200}[on]; w.Code != want {
				t.Errorf("profiling %v: GET %s: %d, want %d", on, path, w.Code, want)
			}
			if on && !strings.Contains(w.Body.String(), "goroutine") && !strings.Contains(w.Body.String(), "heap") {
				t.Errorf("GET %s answered no profile: %.200s", path, w.Body.String())
			}
		}
	}
}
