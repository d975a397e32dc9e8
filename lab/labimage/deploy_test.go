package labimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// deployDir is the repository's deploy/, from this package's folder.
const deployDir = "../../deploy"

// tabbyImageName is tabby's image in the manifests, without its tag.
const tabbyImageName = "ghcr.io/tabbynet/tabby"

// manifestContainer is one container of a pod (template) in deploy/.
type manifestContainer struct {
	where         string // file: kind name, container
	image         string
	command, args []string
}

// deployContainers reads every container of every YAML document under
// deploy/, whatever holds it (Pod, DaemonSet, Deployment, a static pod).
func deployContainers(t *testing.T) []manifestContainer {
	t.Helper()
	var out []manifestContainer
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(p, ".yaml") && !strings.HasSuffix(p, ".yml")) {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			var m map[string]any
			if err := yaml.Unmarshal(doc, &m); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			meta, _ := m["metadata"].(map[string]any)
			name, _ := meta["name"].(string)
			file, _ := filepath.Rel(deployDir, p)
			collectContainers(m, fmt.Sprintf("deploy/%s: %v %s", file, m["kind"], name), &out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// collectContainers finds the lists containers and initContainers anywhere
// in v.
func collectContainers(v any, where string, out *[]manifestContainer) {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			if list, ok := sub.([]any); ok && (k == "containers" || k == "initContainers") {
				for _, c := range list {
					c, _ := c.(map[string]any)
					name, _ := c["name"].(string)
					image, _ := c["image"].(string)
					*out = append(*out, manifestContainer{where: where + ", container " + name, image: image,
						command: stringList(c["command"]), args: stringList(c["args"])})
				}
				continue
			}
			collectContainers(sub, where, out)
		}
	case []any:
		for _, sub := range v {
			collectContainers(sub, where, out)
		}
	}
}

func stringList(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, s := range l {
		out = append(out, fmt.Sprint(s))
	}
	return out
}

// program is what a container runs: its command's first word, or, when
// that is a shell given a script (sh -c SCRIPT), the script's first word
// too.
func (c manifestContainer) programs() ([]string, error) {
	if len(c.command) == 0 {
		return nil, errors.New("no command: tabby's image has no entrypoint, so every container of it names its program")
	}
	progs := []string{c.command[0]}
	if sh := path.Base(c.command[0]); sh == "sh" || sh == "bash" || sh == "dash" {
		words := append(slices.Clone(c.command[1:]), c.args...)
		if i := slices.Index(words, "-c"); i >= 0 && i+1 < len(words) {
			if f := strings.Fields(words[i+1]); len(f) > 0 {
				progs = append(progs, f[0])
			}
		}
	}
	return progs, nil
}

// lookup finds prog in the image's filesystem fsys as a container runtime
// would: an absolute path through the image's symlinks, a bare name in
// PATH's folders. It returns the regular, executable file it ends at.
func lookup(fsys map[string]flatEntry, prog string) (string, error) {
	if !strings.Contains(prog, "/") {
		for _, dir := range strings.Split(strings.TrimPrefix(DefaultPath, "PATH="), ":") {
			if p, err := lookup(fsys, path.Join(dir, prog)); err == nil {
				return p, nil
			}
		}
		return "", fmt.Errorf("%s is in none of the folders of the image's %s", prog, DefaultPath)
	}
	p := cleanPath(prog)
	for hops := 0; hops < 40; hops++ {
		// Resolve the first symlink among p's leading folders or p itself.
		parts := strings.Split(p, "/")
		resolved := true
		for i := range parts {
			prefix := strings.Join(parts[:i+1], "/")
			e, ok := fsys[prefix]
			if !ok {
				return "", fmt.Errorf("%s is not in the image (no /%s)", prog, prefix)
			}
			if e.h.Typeflag == tar.TypeSymlink {
				target := e.h.Linkname
				if !path.IsAbs(target) {
					target = path.Join("/", path.Dir(prefix), target)
				}
				p = cleanPath(path.Join(target, strings.Join(parts[i+1:], "/")))
				resolved = false
				break
			}
		}
		if resolved {
			e := fsys[p]
			if e.h.Typeflag != tar.TypeReg || e.h.Mode&0o111 == 0 {
				return "", fmt.Errorf("%s is /%s, not an executable file", prog, p)
			}
			return "/" + p, nil
		}
	}
	return "", fmt.Errorf("%s: too many symlinks", prog)
}

// TestDeployCommandsInImage builds tabby's image as the lab does (the
// Tabby recipe: deploy/Dockerfile's Debian packages and tabby's programs
// in /usr/local/bin) and checks that every container of tabby's image in
// deploy/ runs a program the image has. The programs are the ones make
// build wrote into $TABBY_BIN_DIR when it holds them all, else stand-ins
// of the same names: the check is about the image's file list, which
// their contents do not change.
func TestDeployCommandsInImage(t *testing.T) {
	c := debCache(t)
	bins := os.Getenv("TABBY_BIN_DIR")
	for _, b := range TabbyBinaries {
		if _, err := os.Stat(filepath.Join(bins, b)); bins == "" || err != nil {
			t.Logf("$TABBY_BIN_DIR=%q lacks %s: the image gets stand-ins of tabby's programs", bins, b)
			bins = binDir(t, TabbyBinaries...)
			break
		}
	}
	spec := Tabby(bins, "deploy-test")
	tarball, _ := build(t, spec, c)
	fsys := flatten(t, load(t, tarball, spec.Ref))

	checked := 0
	for _, mc := range deployContainers(t) {
		if name, _, _ := strings.Cut(mc.image, ":"); name != tabbyImageName {
			t.Logf("%s: image %s is not tabby's; not checked", mc.where, mc.image)
			continue
		}
		progs, err := mc.programs()
		if err != nil {
			t.Errorf("%s: %v", mc.where, err)
			continue
		}
		for _, prog := range progs {
			p, err := lookup(fsys, prog)
			if err != nil {
				t.Errorf("%s runs %s: %v", mc.where, prog, err)
				continue
			}
			t.Logf("%s: %s is %s in the image", mc.where, prog, p)
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no container of tabby's image found in deploy/")
	}
}

// TestLookup: the lookup the test above relies on finds through symlinks
// and PATH, and refuses what is missing or not executable.
func TestLookup(t *testing.T) {
	fsys := map[string]flatEntry{
		"bin":              {h: tar.Header{Typeflag: tar.TypeSymlink, Linkname: "usr/bin"}},
		"usr":              {h: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}},
		"usr/bin":          {h: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}},
		"usr/bin/sleep":    {h: tar.Header{Typeflag: tar.TypeReg, Mode: 0o755}},
		"usr/bin/sh":       {h: tar.Header{Typeflag: tar.TypeSymlink, Linkname: "dash"}},
		"usr/bin/dash":     {h: tar.Header{Typeflag: tar.TypeReg, Mode: 0o755}},
		"usr/bin/readme":   {h: tar.Header{Typeflag: tar.TypeReg, Mode: 0o644}},
		"usr/local":        {h: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}},
		"usr/local/bin":    {h: tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}},
		"usr/local/bin/tb": {h: tar.Header{Typeflag: tar.TypeReg, Mode: 0o755}},
	}
	for prog, want := range map[string]string{"/bin/sleep": "/usr/bin/sleep", "/bin/sh": "/usr/bin/dash", "tb": "/usr/local/bin/tb", "sleep": "/usr/bin/sleep"} {
		if got, err := lookup(fsys, prog); got != want || err != nil {
			t.Errorf("lookup(%s) = %q, %v; want %s", prog, got, err, want)
		}
	}
	for _, prog := range []string{"/usr/bin/readme", "/usr/bin/nope", "/nope/sleep", "nope", "/usr/bin"} {
		if got, err := lookup(fsys, prog); err == nil {
			t.Errorf("lookup(%s) = %q, want an error", prog, got)
		}
	}
	c := manifestContainer{command: []string{"/bin/sh", "-c"}, args: []string{"tabbyctl ipam show"}}
	if got, _ := c.programs(); !slices.Equal(got, []string{"/bin/sh", "tabbyctl"}) {
		t.Errorf("programs of sh -c: %v", got)
	}
}
