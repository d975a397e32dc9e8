package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/daemon"
	extender "github.com/tabbynet/tabby/scheduler-extender"
	"github.com/tabbynet/tabby/scheduler-extender/cache"
)

// recorder is a registry that remembers the name of every metric
// registered with it, from the collectors' descriptions: a vector with no
// child yet is absent from Gather, but not from Describe.
type recorder struct {
	*prometheus.Registry
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// exported is every metric name tabbyd and the extender export, from the
// functions their main packages register them with.
func exported(t *testing.T) map[string]bool {
	rec := &recorder{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
	if _, err := daemon.NewMetrics(rec); err != nil {
		t.Fatal(err)
	}
	ext := &recorder{Registry: extender.NewRegistry(), names: rec.names}
	extender.NewMux(extender.Config{Placements: cache.New()}, ext)
	// NewRegistry registered the Go and process collectors before the
	// recorder saw them; tabbyd's NewMetrics recorded the same names.
	return rec.names
}

// promQLWords are PromQL's keywords, aggregations and functions: the
// identifiers of an expression that are not metric names.
var promQLWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`by without on ignoring group_left group_right bool and or unless offset
		sum min max avg count stddev stdvar topk bottomk quantile count_values group limitk limit_ratio
		rate irate increase delta idelta deriv predict_linear histogram_quantile label_replace label_join
		abs ceil floor round clamp clamp_min clamp_max exp ln log2 log10 sqrt time timestamp vector scalar
		sort sort_desc absent absent_over_time changes resets sum_over_time avg_over_time max_over_time
		min_over_time count_over_time last_over_time quantile_over_time stddev_over_time present_over_time
		day_of_month day_of_week hour minute month year days_in_month inf nan`) {
		promQLWords[w] = true
	}
}

var (
	promStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promNumbers   = regexp.MustCompile(`\b[0-9][0-9A-Za-z_.]*`)
	grafanaVars   = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
	histogramPart = regexp.MustCompile(`_(bucket|sum|count)$`)
)

// metricNames are the metric names a PromQL expression selects: what is
// left of it without strings, label matchers, ranges, grouping labels,
// Grafana variables, numbers and durations, keywords and functions.
func metricNames(expr string) []string {
	s := promStrings.ReplaceAllString(expr, " ")
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRanges.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	s = grafanaVars.ReplaceAllString(s, " ")
	s = promNumbers.ReplaceAllString(s, " ")
	var out []string
	for _, id := range promIdent.FindAllString(s, -1) {
		if !promQLWords[strings.ToLower(id)] {
			out = append(out, id)
		}
	}
	return out
}

func TestMetricNamesOfPromQL(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le, verb) (rate(a_seconds_bucket{x="by(y)", n=~"$node"}[$__rate_interval]))) / on(node) group_left b_total offset 5m > bool 1e3`)
	if strings.Join(got, ",") != "a_seconds_bucket,b_total" {
		t.Errorf("metricNames: %v", got)
	}
}

// TestDashboardNamesExportedMetrics: every query of the Grafana dashboard
// names only metrics that tabbyd or the extender export (a histogram's
// _bucket, _sum and _count by the histogram's name), and each panel has
// a query.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range dashboardProblems(t, b, exported(t)) {
		t.Errorf("the dashboard names a metric no tabby program exports: %s", m)
	}
}

// TestDashboardCheckCatchesMisspelling: misspelling any one metric name of
// the dashboard, in any panel, makes the check above fail, naming it.
func TestDashboardCheckCatchesMisspelling(t *testing.T) {
	b, err := os.ReadFile("monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	var d struct {
		Panels []struct{ Targets []struct{ Expr string } }
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	used := map[string]bool{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range metricNames(tg.Expr) {
				used[histogramPart.ReplaceAllString(n, "")] = true
			}
		}
	}
	for _, want := range []string{"tabby_cni_command_duration_seconds", "tabby_ipam_pool_allocated", "tabby_ipam_pool_size",
		"tabby_ipam_pool_allocatable", "tabby_ipam_pool_blocks", "tabby_scheduler_extender_filtered_nodes_total",
		"tabby_scheduler_extender_filter_answers_total"} {
		if !used[want] {
			t.Errorf("the dashboard does not use %s", want)
		}
	}
	for n := range used {
		typo := strings.Replace(n, "_", "__", 1)
		bad := regexp.MustCompile(`\b`+regexp.QuoteMeta(n)+`(_bucket|_sum|_count)?\b`).ReplaceAllString(string(b), typo+"$1")
		found := false
		for _, p := range dashboardProblems(t, []byte(bad), names) {
			found = found || strings.Contains(p, typo)
		}
		if !found {
			t.Errorf("the check passes a dashboard that names %s instead of %s", typo, n)
		}
	}
}

// dashboardProblems are the dashboard's panels without a query and the
// metric names its queries and variables use that names does not hold.
func dashboardProblems(t *testing.T, b []byte, names map[string]bool) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name       string
				Definition string
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if !names["tabby_bgp_sessions"] || !names["bgp_peer_state"] || !names["tabby_scheduler_extender_requests_total"] {
		t.Fatalf("the registries lack names they must have: %d names", len(names))
	}
	known := func(n string) bool { return names[n] || names[histogramPart.ReplaceAllString(n, "")] }
	var missing []string
	check := func(where, expr string) {
		ns := metricNames(expr)
		if len(ns) == 0 {
			missing = append(missing, where+": no metric in "+expr)
		}
		for _, n := range ns {
			if !known(n) {
				missing = append(missing, where+": "+n)
			}
		}
	}
	if len(d.Panels) < 10 {
		t.Errorf("the dashboard has %d panels", len(d.Panels))
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			missing = append(missing, p.Title+": no query")
		}
		for _, tg := range p.Targets {
			check(p.Title, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			check("variable "+v.Name, strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ", node)"))
		}
	}
	sort.Strings(missing)
	return missing
}
