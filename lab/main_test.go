package lab

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/tabbynet/tabby/internal/tier"
)

// requireRoot skips a test that needs root (namespaces) when not root.
func requireRoot(t *testing.T) {
	t.Helper()
	tier.Root(t, "to create network namespaces")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
