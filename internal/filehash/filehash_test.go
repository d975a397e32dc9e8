package filehash

import (
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestSHA256(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	// FIPS 180-2's example: SHA-256("abc").
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got, err := SHA256(p); err != nil || got != want {
		t.Errorf("SHA256 = %q, %v; want %q", got, err, want)
	}
}

func TestCopyAppends(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	_ = os.WriteFile(a, []byte("ab"), 0o644)
	_ = os.WriteFile(b, []byte("c"), 0o644)
	h := sha256.New()
	if err := Copy(h, a); err != nil {
		t.Fatal(err)
	}
	if err := Copy(h, b); err != nil {
		t.Fatal(err)
	}
	if got, want := h.Sum(nil), sha256.Sum256([]byte("abc")); string(got) != string(want[:]) {
		t.Errorf("two files hashed in turn are not the hash of their concatenation")
	}
}

func TestMissingFile(t *testing.T) {
	if _, err := SHA256(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("SHA256 of a missing file: %v, want fs.ErrNotExist", err)
	}
}
