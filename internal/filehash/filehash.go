// Package filehash hashes the contents of files: install-cni compares the
// binaries it ships with the host's by them, and the lab keys its cached
// images and packages by them.
package filehash

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
)

// Copy writes the contents of the file at path to w (a running hash).
func Copy(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// SHA256 is the hex SHA-256 of the contents of the file at path.
func SHA256(path string) (string, error) {
	h := sha256.New()
	if err := Copy(h, path); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
