package lab

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

// envShim makes the test binary act as `tabbyctl lab shim --exit-file
// $envShim -- ARGS...`, so the shim is tested as the process it is.
const envShim = "TABBY_LAB_TEST_SHIM"

func TestMain(m *testing.M) {
	if f := os.Getenv(envShim); f != "" {
		os.Exit(RunShim(f, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// requireRoot fails a test that needs root (namespaces) when not root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (network namespaces): run it as root, for example with sudo -E go test")
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
