package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"golang.org/x/sys/unix"
)

// EnvDirect names the plugin whose command tabby-ipam runs when the tabby
// plugin hands a command over (see ReexecDirect): "tabby".
const EnvDirect = "TABBY_CNI_DIRECT"

// ReexecDirect hands the command to the tabby-ipam binary, which carries the
// datastore client that the tabby binary leaves out (so that tabby, when it
// only speaks to tabbyd's agent, starts in a fraction of the time). The
// process is replaced (execve): same pid, environment (plus EnvDirect=name),
// stdout and stderr, and stdin holds the network config again. tabby-ipam
// is found on CNI_PATH, else beside this binary. It returns only on failure.
func ReexecDirect(args *skel.CmdArgs, name string) error {
	if os.Getenv(EnvDirect) != "" {
		return errors.New("tabby: no datastore client in this binary, and it was already handed the command")
	}
	path, err := directBinary()
	if err != nil {
		return fmt.Errorf("tabby: tabbyd's CNI agent is not available, and the API server cannot be reached directly without %s: %w (install it beside tabby, as tabbyctl install-cni does)", IPAMTypeTabby, err)
	}
	fd, err := unix.MemfdCreate("tabby-cni-config", 0)
	if err != nil {
		return fmt.Errorf("tabby: handing the command to %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), "tabby-cni-config")
	if _, err := f.Write(args.StdinData); err != nil {
		return fmt.Errorf("tabby: handing the command to %s: %w", path, err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		return fmt.Errorf("tabby: handing the command to %s: %w", path, err)
	}
	if err := unix.Dup3(fd, 0, 0); err != nil {
		return fmt.Errorf("tabby: handing the command to %s: %w", path, err)
	}
	err = unix.Exec(path, []string{IPAMTypeTabby}, append(os.Environ(), EnvDirect+"="+name))
	return fmt.Errorf("tabby: handing the command to %s: %w", path, err)
}

func directBinary() (string, error) {
	if p, err := invoke.FindInPath(IPAMTypeTabby, filepath.SplitList(os.Getenv("CNI_PATH"))); err == nil {
		return p, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), IPAMTypeTabby)
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	return p, nil
}
