package labtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/tabbynet/tabby/lab"
)

// A lab's programs run detached (session leaders), so a test process
// killed before its cleanups run (at go test's -timeout, or by kill -9)
// leaves its labs running: a control plane, kubelets and containerd per
// lab, busy on a machine where the next test run then competes with them.
// Up records each lab's owner, the test process, in OwnersDir; Setup first
// removes the labs whose owner is gone (sweepOrphans).

// OwnersDir holds a file per running lab of this package, named after the
// lab, with its owner (owner).
var OwnersDir = filepath.Join(os.TempDir(), "tabby-labtest-owners")

// owner is the test process that made a lab, and the lab's folder.
type owner struct {
	PID int `json:"pid"`
	// Start is the process's start time (/proc/PID/stat, in clock ticks
	// since boot): a pid reused by another process has another.
	Start uint64 `json:"start"`
	Dir   string `json:"dir"`
}

// registerOwner records this process as the owner of lab name in dir;
// unregister removes the record (once the lab is down).
func registerOwner(name, dir string) (unregister func(), err error) {
	start := procStart(os.Getpid())
	if start == 0 {
		return nil, errors.New("reading this process's start time in /proc")
	}
	b, err := json.Marshal(owner{PID: os.Getpid(), Start: start, Dir: dir})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(OwnersDir, 0o700); err != nil {
		return nil, err
	}
	// Written whole, then renamed: a sweep never reads half a record.
	path := filepath.Join(OwnersDir, name)
	tmp := filepath.Join(OwnersDir, "."+name)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}
	return func() { _ = os.Remove(path) }, nil
}

// sweepOrphans removes, with down, every lab recorded in OwnersDir whose
// owner is no longer running, and its record; the labs of running test
// processes (this one's, other packages') stay. It reports on log what it
// removed, and returns the errors of the labs it could not remove (whose
// records stay, for the next run).
func sweepOrphans(log io.Writer, down func(name, dir string) error) error {
	entries, err := os.ReadDir(OwnersDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(OwnersDir, name)
		if lab.CheckName(name) != nil {
			continue // not a record (".name" is one being written)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var o owner
		if err := json.Unmarshal(b, &o); err != nil || o.PID <= 0 || o.Dir == "" {
			errs = append(errs, fmt.Errorf("%s: not an owner record (%v): remove it by hand", path, err))
			continue
		}
		if start := procStart(o.PID); start != 0 && start == o.Start {
			continue
		}
		if err := down(name, o.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing lab %s, left by test process %d: %w", name, o.PID, err))
			continue
		}
		fmt.Fprintf(log, "labtest: removed lab %s (%s), left running by test process %d, which is gone\n", name, o.Dir, o.PID)
		if err := os.Remove(path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// downLab removes a lab with tabbyctl lab down, by its namespaces' names
// when its state is gone.
func downLab(name, dir string) error {
	if out, code := run(nil, Tabbyctl(), "lab", "--dir", dir, "down", "--name", name); code != 0 {
		return fmt.Errorf("tabbyctl lab down: %s", strings.TrimSpace(out))
	}
	return nil
}
