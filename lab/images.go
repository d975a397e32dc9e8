package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tabbynet/tabby/internal/filehash"
	"github.com/tabbynet/tabby/lab/labimage"
)

// TabbyImagePrograms are tabby's programs and the CNI plugins its image
// ships (make build puts them in bin/).
var TabbyImagePrograms = labimage.TabbyBinaries

// tabbyImagesKept is how many of tabby's own images (one per build of its
// programs) the cache keeps.
const tabbyImagesKept = 4

// buildImages builds the images every node imports, or finds them in the
// cache (a tarball is named by a hash of what goes into it): the pause
// image, agnhost, kube-proxy, CoreDNS, and tabby's from the programs in
// BinDir, tagged lab-<hash of them>. It returns the tarballs and tabby's
// image reference.
func buildImages(ctx context.Context, s *State, o *Options) (tarballs []string, tabbyRef string, err error) {
	if o.CacheDir == "" {
		return nil, "", errors.New("the lab needs a cache folder for its images (Options.CacheDir)")
	}
	dir := filepath.Join(o.CacheDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	cp, rt := s.Binaries.ControlPlaneDir, s.Binaries.RuntimeDir
	version, err := filesHash(s.Binaries.PluginDir, TabbyImagePrograms)
	if err != nil {
		return nil, "", fmt.Errorf("tabby's programs for its image: %w (run make build)", err)
	}
	tabby := labimage.Tabby(s.Binaries.PluginDir, "lab-"+version[:12])
	specs := []labimage.Spec{
		labimage.Pause(filepath.Join(cp, "pause"), PauseImage),
		labimage.Agnhost(filepath.Join(cp, "agnhost")),
		labimage.KubeProxy(filepath.Join(cp, "kube-proxy")),
		labimage.CoreDNS(filepath.Join(rt, "coredns"), CoreDNSImage),
		tabby,
	}
	debs := labimage.NewDebCache(labimage.DebCacheDir(o.CacheDir))
	tarballs = make([]string, len(specs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for i, spec := range specs {
		g.Go(func() error {
			key, err := specKey(spec)
			if err != nil {
				return err
			}
			out := filepath.Join(dir, imageFileName(spec.Ref)+"-"+key[:16]+".tar")
			tarballs[i] = out
			if _, err := os.Stat(out); err == nil {
				now := time.Now()
				_ = os.Chtimes(out, now, now) // kept by the pruning below
				return nil
			}
			start := time.Now()
			if _, err := labimage.Build(gctx, spec, debs, out); err != nil {
				return fmt.Errorf("building the image %s: %w", spec.Ref, err)
			}
			o.progress("image %s built in %.1fs", spec.Ref, time.Since(start).Seconds())
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, "", err
	}
	pruneImages(dir, imageFileName(tabby.Ref[:strings.LastIndex(tabby.Ref, ":")]), tabbyImagesKept)
	return tarballs, tabby.Ref, nil
}

// imageFileName turns an image reference into a file name.
func imageFileName(ref string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(ref)
}

// specKey hashes an image's spec and the contents of the files it copies.
func specKey(spec labimage.Spec) (string, error) {
	h := sha256.New()
	if err := json.NewEncoder(h).Encode(spec); err != nil {
		return "", err
	}
	for _, f := range spec.Files {
		if f.Src == "" {
			continue
		}
		if err := filehash.Copy(h, f.Src); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// filesHash hashes the contents of the named files of dir.
func filesHash(dir string, names []string) (string, error) {
	h := sha256.New()
	for _, n := range names {
		if err := filehash.Copy(h, filepath.Join(dir, n)); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// pruneImages keeps the keep most recently used tarballs whose names start
// with prefix and removes the others.
func pruneImages(dir, prefix string, keep int) {
	entries, _ := os.ReadDir(dir)
	type file struct {
		path string
		mod  time.Time
	}
	var files []file
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix+"_") || !strings.HasSuffix(e.Name(), ".tar") {
			continue
		}
		if info, err := e.Info(); err == nil {
			files = append(files, file{filepath.Join(dir, e.Name()), info.ModTime()})
		}
	}
	slices.SortFunc(files, func(a, b file) int { return b.mod.Compare(a.mod) })
	for i, f := range files {
		if i >= keep {
			_ = os.Remove(f.path)
		}
	}
}

// LoadImages imports image tarballs (docker-archive or OCI, as docker save
// and ctr export write them) into every node's containerd, in the k8s.io
// namespace where kubelet looks, as kind load image-archive does.
func LoadImages(ctx context.Context, s *State, tarballs []string, out io.Writer) error {
	for _, t := range tarballs {
		if _, err := os.Stat(t); err != nil {
			return fmt.Errorf("image tarball: %w", err)
		}
	}
	abs := make([]string, len(tarballs))
	for i, t := range tarballs {
		a, err := filepath.Abs(t)
		if err != nil {
			return err
		}
		abs[i] = a
	}
	g, gctx := errgroup.WithContext(ctx)
	for i := range s.Nodes {
		n := &s.Nodes[i]
		g.Go(func() error {
			if !n.Containerd.Alive() {
				return fmt.Errorf("the containerd of %s is not running (tabbyctl lab restart %s containerd)", n.Name, n.Name)
			}
			return importImages(gctx, s, n, abs)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, t := range tarballs {
		fmt.Fprintf(out, "%s: imported into %d nodes\n", t, len(s.Nodes))
	}
	return nil
}
