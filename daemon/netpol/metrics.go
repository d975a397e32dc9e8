package netpol

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// metrics are the policy loop's Prometheus metrics.
type metrics struct {
	syncs         *prometheus.CounterVec
	syncTime      *prometheus.HistogramVec
	rules         prometheus.Gauge
	chains        prometheus.Gauge
	sets          prometheus.Gauge
	setMembers    prometheus.Gauge
	endpoints     *prometheus.GaugeVec
	policies      prometheus.Gauge
	problems      prometheus.Gauge
	overLimit     *prometheus.GaugeVec
	lastSyncOK    prometheus.Gauge
	jumpChecks    *prometheus.CounterVec
	audits        *prometheus.CounterVec
	programmedAt  prometheus.Gauge
	jumpRepairs   prometheus.Counter
	kernelChanges *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_policy_syncs_total",
			Help: "Full syncs of NetworkPolicy (compile and apply), by result (ok, error).",
		}, []string{"result"}),
		syncTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tabby_policy_sync_duration_seconds",
			Help:    "How long a NetworkPolicy sync took, by phase (compile, apply, total).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"phase"}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_rules",
			Help: "iptables rules in tabby's policy chains, as last programmed.",
		}),
		chains: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_chains",
			Help: "tabby's policy chains, as last programmed.",
		}),
		sets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_ipsets",
			Help: "tabby's policy ipsets, as last programmed.",
		}),
		setMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_ipset_members",
			Help: "Members of tabby's policy ipsets, as last programmed.",
		}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tabby_policy_endpoints",
			Help: "Pods with addresses the last sync knew, by scope (local: on this node, remote).",
		}, []string{"scope"}),
		policies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_networkpolicies",
			Help: "NetworkPolicies the last sync compiled.",
		}),
		problems: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_problems",
			Help: "NetworkPolicies the compiler refused in the last sync (each is logged and reported as an Event on the policy).",
		}),
		overLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tabby_policy_networkpolicies_over_limit",
			Help: "NetworkPolicies over a limit in the last sync, by limit (the tabbyd flag that raises it): each allows nothing to the pods it selects (fail closed) and is reported as an Event on the policy.",
		}, []string{"limit"}),
		lastSyncOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_last_sync_success",
			Help: "1 when the last NetworkPolicy sync programmed the kernel, else 0.",
		}),
		jumpChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_policy_jump_checks_total",
			Help: "Periodic checks of tabby's jumps from the built-in chains, by result (ok, error, preempted: cut short for a sync, and run again after it).",
		}, []string{"result"}),
		audits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_policy_kernel_audits_total",
			Help: "Periodic reads of the kernel that repair what was changed behind tabby's back, by result (ok, error, preempted: cut short for a sync, and run again after it).",
		}, []string{"result"}),
		kernelChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_policy_kernel_changes_total",
			Help: "Changes tabbyd made to the kernel for NetworkPolicy, by object (set, member, chain, jump, restore).",
		}, []string{"object"}),
		jumpRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabby_policy_jump_repairs_total",
			Help: "Jumps into tabby's policy chains that a periodic check found removed or moved and put back.",
		}),
		programmedAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_policy_last_sync_timestamp_seconds",
			Help: "When the kernel was last programmed successfully (Unix time).",
		}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	return errors.Join(r.Register(m.syncs), r.Register(m.syncTime), r.Register(m.rules), r.Register(m.chains),
		r.Register(m.sets), r.Register(m.setMembers), r.Register(m.endpoints), r.Register(m.policies),
		r.Register(m.problems), r.Register(m.lastSyncOK), r.Register(m.jumpChecks), r.Register(m.audits), r.Register(m.programmedAt),
		r.Register(m.kernelChanges), r.Register(m.jumpRepairs), r.Register(m.overLimit))
}

// Metrics are the policy loop's metrics, made before the loop so that a
// program registers all of its metrics in one place (daemon.NewMetrics).
// The denied-packet log's are there too.
type Metrics struct {
	m      *metrics
	denied *deniedMetrics
}

// NewMetrics registers the policy loop's metrics with r.
func NewMetrics(r prometheus.Registerer) (*Metrics, error) {
	m, d := newMetrics(), newDeniedMetrics()
	if err := errors.Join(m.register(r), d.register(r)); err != nil {
		return nil, fmt.Errorf("netpol: registering metrics: %w", err)
	}
	return &Metrics{m, d}, nil
}

// observeRuleset sets the size gauges from a ruleset.
func (m *metrics) observeRuleset(in *policy.Input, rs *policy.Ruleset) {
	rules, members := 0, 0
	for _, c := range rs.Chains {
		rules += len(c.Rules)
	}
	for _, s := range rs.Sets {
		members += len(s.Members)
	}
	m.rules.Set(float64(rules + len(rs.Jumps)))
	m.chains.Set(float64(len(rs.Chains)))
	m.sets.Set(float64(len(rs.Sets)))
	m.setMembers.Set(float64(members))
	m.problems.Set(float64(len(rs.Problems)))
	over := map[string]int{policy.FlagMaxSetMembers: 0, policy.FlagMaxPolicySets: 0, policy.FlagMaxRules: 0}
	for _, p := range rs.Problems {
		if p.Limit != "" {
			over[p.Limit]++
		}
	}
	for l, n := range over {
		m.overLimit.WithLabelValues(l).Set(float64(n))
	}
	m.policies.Set(float64(len(in.Policies)))
	local := 0
	for _, e := range in.Endpoints {
		if e.HostIface != "" {
			local++
		}
	}
	m.endpoints.WithLabelValues("local").Set(float64(local))
	m.endpoints.WithLabelValues("remote").Set(float64(len(in.Endpoints) - local))
}

// observeStats counts what an Apply changed.
func (m *metrics) observeStats(st apply.Stats) {
	for obj, n := range map[string]int{
		"set":     st.SetsCreated + st.SetsUpdated + st.SetsDeleted,
		"member":  st.MembersAdded + st.MembersRemoved,
		"chain":   st.ChainsWritten + st.ChainsDeleted,
		"jump":    st.JumpsInserted + st.JumpsDeleted,
		"restore": st.Restores,
	} {
		if n > 0 {
			m.kernelChanges.WithLabelValues(obj).Add(float64(n))
		}
	}
}
