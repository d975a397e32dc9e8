package labimage

import (
	"errors"
	"path/filepath"
)

// EnvCacheDir names the environment variable that sets tabby's cache folder.
const EnvCacheDir = "TABBY_CACHE_DIR"

// DefaultCacheDir is tabby's cache folder, outside any checkout so that
// every checkout shares what it holds (the Debian packages are in its
// folder "debs"): $TABBY_CACHE_DIR, else $XDG_CACHE_HOME/tabby, else
// $HOME/.cache/tabby. getenv is os.Getenv, given by a main package or a
// test: this package reads no environment itself.
func DefaultCacheDir(getenv func(string) string) (string, error) {
	if d := getenv(EnvCacheDir); d != "" {
		return d, nil
	}
	if d := getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "tabby"), nil
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".cache", "tabby"), nil
	}
	return "", errors.New("no cache folder: set " + EnvCacheDir + " or HOME")
}

// DebCacheDir is the folder of Debian packages inside the cache folder dir.
func DebCacheDir(dir string) string { return filepath.Join(dir, "debs") }
