package clitest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/ipam/inspect"
	"github.com/tabbynet/tabby/lab"
)

// formatCase is one command whose -o formats are checked: decode parses
// json and yaml output into the command's struct, header picks the table
// line whose columns wide must outnumber.
type formatCase struct {
	name   string
	args   []string
	code   int
	decode func(data []byte, yamlIn bool) (any, error)
	header string // the first column of the table checked for wide
}

func decodeAs[T any](data []byte, yamlIn bool) (any, error) {
	var v T
	if yamlIn {
		err := yaml.UnmarshalStrict(data, &v)
		return v, err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	err := dec.Decode(&v)
	return v, err
}

// columns counts the columns of the line of out starting with first
// (tables separate columns by two spaces or more).
func columns(t *testing.T, out, first string) int {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), first) {
			return len(regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1))
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", first, out)
	return 0
}

// TestOutputFormats: every command that prints a report takes -o table,
// wide, json and yaml; json and yaml decode (strictly) into the same
// struct with the same content, and wide has more columns than table.
func TestOutputFormats(t *testing.T) {
	_, leak := fresh(t)
	st := sampleStatus(false)
	endpoint := tabbydStatus(t, st)
	labDir := fakeLab(t)
	kc := []string{"--kubeconfig", cli.Kubeconfig}
	for _, tc := range []formatCase{
		{"ipam show", append([]string{"ipam", "show"}, kc...), 0, decodeAs[inspect.ShowReport], "BLOCK"},
		{"ipam show --ip", append([]string{"ipam", "show", "--ip", leak, "--grace", "0"}, kc...), 0, decodeAs[inspect.IPReport], "SEVERITY"},
		{"ipam check", append([]string{"ipam", "check", "--confirm", "0", "--grace", "0"}, kc...), 1, decodeAs[inspect.CheckReport], "SEVERITY"},
		{"node status", []string{"node", "status", "--endpoint", endpoint}, 1, decodeAs[nodestatus.Status], "PEER ADDRESS"},
		{"lab status", []string{"lab", "status", "--dir", labDir}, 0, decodeAs[lab.Report], "NODE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := map[string]result{}
			for _, o := range []string{"table", "wide", "json", "yaml"} {
				r := run(t, env(t), cli.Tabbyctl, append(tc.args, "-o", o)...)
				if r.code != tc.code {
					t.Fatalf("-o %s: exit %d, want %d:\n%s", o, r.code, tc.code, r)
				}
				out[o] = r
			}
			fromJSON, err := tc.decode([]byte(out["json"].stdout), false)
			if err != nil {
				t.Fatalf("-o json is not the report: %v", err)
			}
			fromYAML, err := tc.decode([]byte(out["yaml"].stdout), true)
			if err != nil {
				t.Fatalf("-o yaml is not the report: %v", err)
			}
			// Times differ between the runs of lab status and node status
			// only in what was asked; the rest must be the same report.
			if tc.name == "ipam show" || tc.name == "ipam show --ip" {
				if !reflect.DeepEqual(fromJSON, fromYAML) {
					t.Errorf("-o json and -o yaml differ:\n%+v\n%+v", fromJSON, fromYAML)
				}
			}
			if reflect.ValueOf(fromJSON).IsZero() {
				t.Errorf("-o json decoded to an empty report")
			}
			if n, w := columns(t, out["table"].stdout, tc.header), columns(t, out["wide"].stdout, tc.header); w <= n {
				t.Errorf("-o wide has %d columns in its %s table, -o table %d: want more", w, tc.header, n)
			}
		})
	}
}

// TestReleaseFormats: release prints a line per address, or with -o json
// and -o yaml a result per address.
func TestReleaseFormats(t *testing.T) {
	_, leak := fresh(t)
	r := ctl(t, "ipam", "release", "--ip", "192.0.2.7", "-o", "yaml")
	var res []inspect.ReleaseResult
	if err := yaml.UnmarshalStrict([]byte(r.stdout), &res); err != nil || r.code != 1 || len(res) != 1 || res[0].Error == "" {
		t.Errorf("release of an address in no pool, -o yaml: %v\n%s", err, r)
	}
	r = ctl(t, "ipam", "release", "--ip", leak, "--grace", "0", "-o", "json")
	res = nil
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 || len(res) != 1 || !res[0].Released {
		t.Errorf("release of the leak, -o json: %v\n%s", err, r)
	}
}

// TestDeprecatedJSON: --json of earlier releases still prints JSON (on
// stdout, the warning on stderr) and is not in the help.
func TestDeprecatedJSON(t *testing.T) {
	endpoint := tabbydStatus(t, sampleStatus(true))
	bin := program(t)
	r := run(t, env(t), bin, "node", "status", "--endpoint", endpoint, "--json")
	var st nodestatus.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 || st.Node != "node1" {
		t.Errorf("node status --json: %v\n%s", err, r)
	}
	if !strings.Contains(r.stderr, "--json has been deprecated, use -o json") {
		t.Errorf("node status --json does not say it is deprecated:\n%s", r)
	}
	if h := run(t, env(t), bin, "node", "status", "--help"); strings.Contains(h.stdout, "--json") || !strings.Contains(h.stdout, "-o, --output") {
		t.Errorf("node status --help:\n%s", h)
	}
}

// fakeLab writes the state of a lab whose one node's namespace does not
// exist, pointing at the real API server: lab status reports it (the
// node's tabbyd unreachable) without a lab running.
func fakeLab(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	st := map[string]any{
		"version": 2, "name": "clitest", "dir": dir, "created": time.Now(), "ready": true, "subnets": 1,
		"kubeconfig": cli.Kubeconfig,
		"nodes":      []map[string]any{{"name": "node1", "netns": "tabby-clitest-absent-node1", "address": "10.77.0.11", "subnet": 1, "runtime": "containerd"}},
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, lab.StateFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
