package lab

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
)

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
