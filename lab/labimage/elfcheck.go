package labimage

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os/exec"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"
)

// gnuTriplet is Debian's multiarch folder name for the images' architecture.
var gnuTriplet = map[string]string{
	"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu",
}[runtime.GOARCH]

// elfMachine is the ELF machine of the images' architecture.
var elfMachine = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64,
}[runtime.GOARCH]

// libraryPath is where Debian's dynamic loader looks without an
// ld.so.cache (images have none: ldconfig does not run): its system search
// path, as `ld.so --help` prints it.
var libraryPath = []string{"lib/" + gnuTriplet, "usr/lib/" + gnuTriplet, "lib", "usr/lib"}

// dlopened are plugins that programs load with dlopen, which neither
// DT_NEEDED nor ldd shows: a program whose name matches the pattern needs
// the plugin too.
var dlopened = []struct{ program, needs, pkg string }{
	// iptables loads its matches and targets (even the standard target of
	// every rule) from its xtables folder.
	{"xtables-*-multi", "usr/lib/" + gnuTriplet + "/xtables/libxt_standard.so", "iptables"},
}

// MissingLibrariesError is the error of an image whose programs or
// libraries need libraries (or an ELF interpreter) that the image lacks.
type MissingLibrariesError struct {
	Ref     string
	Missing []MissingLibrary // sorted by Name
}

// MissingLibrary is one library (or interpreter, or dlopened plugin) that
// the image lacks.
type MissingLibrary struct {
	// Name is the library's name as the needer gives it ("libxtables.so.12"),
	// or a path in the image for an interpreter or a plugin.
	Name string
	// What is "library", "ELF interpreter" or "plugin loaded by dlopen".
	What string
	// Package is the Debian package that usually ships it ("" when unknown:
	// the host's dpkg does not know it).
	Package string
	// NeededBy are the image's files that need it, programs first.
	NeededBy []string
}

func (e *MissingLibrariesError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "image %s could not run its programs:", e.Ref)
	for _, m := range e.Missing {
		fmt.Fprintf(&b, "\n  missing %s %s", m.What, m.Name)
		if m.Package != "" {
			fmt.Fprintf(&b, " (Debian package %s)", m.Package)
		}
		const max = 4
		b.WriteString(", needed by " + strings.Join(m.NeededBy[:min(max, len(m.NeededBy))], ", "))
		if len(m.NeededBy) > max {
			fmt.Fprintf(&b, " and %d more", len(m.NeededBy)-max)
		}
	}
	b.WriteString("\nadd the Debian packages that ship them to Spec.Debs")
	return b.String()
}

// checkELF checks every ELF program and shared library in the image: its
// interpreter (PT_INTERP) and each library it needs (DT_NEEDED, searched in
// its RUNPATH or RPATH and the loader's system search path) must be in the
// image, following symlinks inside the image. It also checks the plugins
// of dlopened.
func checkELF(ctx context.Context, v view, ref string) error {
	missing := map[[2]string]*MissingLibrary{}
	need := func(file, name, what, pkg string) {
		k := [2]string{what, name}
		if missing[k] == nil {
			missing[k] = &MissingLibrary{Name: name, What: what, Package: pkg}
		}
		missing[k].NeededBy = append(missing[k].NeededBy, "/"+file)
	}
	for _, p := range v.paths() {
		e := v.get(p)
		if e.kind != kindFile || len(e.data) < 4 || !bytes.HasPrefix(e.data, []byte(elf.ELFMAG)) {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(e.data))
		if err != nil || f.Machine != elfMachine || (f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN) {
			continue // not code this image runs (BPF objects, firmware, other architectures)
		}
		for _, prog := range f.Progs {
			if prog.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				continue
			}
			interp := string(bytes.TrimRight(b, "\x00"))
			if v.regular(interp) == nil {
				need(p, interp, "ELF interpreter", "")
			}
		}
		needed, _ := f.ImportedLibraries()
		dirs := searchDirs(f, p)
		for _, lib := range needed {
			if !findLib(v, lib, dirs) {
				need(p, lib, "library", "")
			}
		}
		for _, d := range dlopened {
			if ok, _ := path.Match(d.program, path.Base(p)); ok && v.regular(d.needs) == nil {
				need(p, "/"+d.needs, "plugin loaded by dlopen", d.pkg)
			}
		}
		f.Close()
	}
	if len(missing) == 0 {
		return nil
	}
	err := &MissingLibrariesError{Ref: ref}
	for _, m := range missing {
		if m.Package == "" && len(err.Missing) < 20 {
			m.Package = packageOf(ctx, path.Base(m.Name))
		}
		slices.SortFunc(m.NeededBy, func(a, b string) int {
			if la, lb := isLibrary(a), isLibrary(b); la != lb {
				if la {
					return 1
				}
				return -1
			}
			return strings.Compare(a, b)
		})
		err.Missing = append(err.Missing, *m)
	}
	slices.SortFunc(err.Missing, func(a, b MissingLibrary) int { return strings.Compare(a.Name, b.Name) })
	return err
}

// isLibrary tells a shared library ("libfoo.so.1", "xtables/libxt_tcp.so")
// from a program by its name.
func isLibrary(p string) bool {
	b := path.Base(p)
	return strings.HasSuffix(b, ".so") || strings.Contains(b, ".so.")
}

// searchDirs is where the loader looks for the libraries that the object at
// path p needs: its DT_RUNPATH (or else DT_RPATH) with $ORIGIN expanded,
// then the system search path.
func searchDirs(f *elf.File, p string) []string {
	rp, _ := f.DynString(elf.DT_RUNPATH)
	if len(rp) == 0 {
		rp, _ = f.DynString(elf.DT_RPATH)
	}
	var dirs []string
	for _, s := range rp {
		for _, d := range strings.Split(s, ":") {
			d = strings.NewReplacer("${ORIGIN}", "/"+path.Dir(p), "$ORIGIN", "/"+path.Dir(p)).Replace(d)
			if d != "" {
				dirs = append(dirs, d)
			}
		}
	}
	return append(dirs, libraryPath...)
}

func findLib(v view, lib string, dirs []string) bool {
	if strings.Contains(lib, "/") {
		return v.regular(lib) != nil
	}
	for _, d := range dirs {
		if v.regular(path.Join(d, lib)) != nil {
			return true
		}
	}
	return false
}

// packageOf names the Debian package that ships the file called name on
// this host (dpkg-query -S), or "" when the host does not have it.
func packageOf(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "dpkg-query", "-S", "*/"+name).Output()
	if err != nil {
		return ""
	}
	var pkgs []string
	for _, line := range strings.Split(string(out), "\n") {
		pkgsPart, file, ok := strings.Cut(line, ": ")
		if !ok || path.Base(file) != name || strings.HasPrefix(pkgsPart, "diversion") {
			continue
		}
		for _, pk := range strings.Split(pkgsPart, ", ") {
			pk, _, _ = strings.Cut(pk, ":")
			if !slices.Contains(pkgs, pk) {
				pkgs = append(pkgs, pk)
			}
		}
	}
	return strings.Join(pkgs, " or ")
}
