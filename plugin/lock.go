package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// NodeLock is an exclusive flock on the node's IPAM lock file. It
// serialises the IPAM part of concurrent CNI commands on one node; the
// kernel drops it when the process exits, so a killed plugin never leaves
// it held.
type NodeLock struct {
	f *os.File
}

// LockNode takes the lock at path, waiting until ctx is done.
func LockNode(ctx context.Context, path string) (*NodeLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the folder of the IPAM lock file %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the IPAM lock file %s: %w", path, err)
	}
	// A blocking flock wakes the next waiter as soon as the holder lets go;
	// it runs in a goroutine so that ctx can bound the wait. If ctx ends
	// first, the goroutine gives the lock back as soon as it gets it.
	got := make(chan error) // unbuffered: a lock is handed over only to a waiting caller
	abandoned := make(chan struct{})
	go func() {
		var err error
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		select {
		case got <- err:
		case <-abandoned:
			if err == nil {
				_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			}
			f.Close()
		}
	}()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		return &NodeLock{f: f}, nil
	case <-ctx.Done():
		close(abandoned)
		return nil, fmt.Errorf("waiting for the IPAM lock %s (another CNI command on this node holds it): %w", path, ctx.Err())
	}
}

// Unlock releases the lock.
func (l *NodeLock) Unlock() {
	if l == nil || l.f == nil {
		return
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
