package testnet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// EnvBinDir names a folder holding prebuilt tabby and tabby-ipam binaries
// (`make build` puts them in ./bin).
const EnvBinDir = "TABBY_BIN_DIR"

// PluginDir is the folder of the tabby and tabby-ipam plugins under test:
// $TABBY_BIN_DIR when set, else buildDir after building them there from
// the repository above the working directory.
func PluginDir(buildDir string) (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		for _, bin := range []string{"tabby", "tabby-ipam"} {
			if _, err := os.Stat(filepath.Join(d, bin)); err != nil {
				return "", fmt.Errorf("$%s=%s lacks %s (run make build): %w", EnvBinDir, d, bin, err)
			}
		}
		return d, nil
	}
	root, err := controlplane.FindRepoRoot()
	if err != nil {
		return "", fmt.Errorf("finding the repository to build the plugins (or set $%s): %w", EnvBinDir, err)
	}
	cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/tabby", "./cmd/tabby-ipam")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the CNI plugins: %v\n%s", err, out)
	}
	return buildDir, nil
}
