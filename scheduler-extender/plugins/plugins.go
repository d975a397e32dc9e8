// Package plugins assembles tabby-scheduler-extender's plugins into the
// framework it runs, in kube-scheduler v1.35's filter order and with its
// default score weights.
package plugins

import (
	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/interpodaffinity"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodeaffinity"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodename"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/podtopologyspread"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/tainttoleration"
)

// Default score weights: upstream's for its plugins; the network's own is
// as heavy as node affinity.
const (
	WeightNodeAffinity      = 2
	WeightTaintToleration   = 3
	WeightPodTopologySpread = 2
	WeightInterPodAffinity  = 2
	WeightNetwork           = 2
)

// Default is the framework of tabby-scheduler-extender: NodeName,
// TaintToleration, NodeAffinity, the network, PodTopologySpread and
// InterPodAffinity filter in that order (upstream's order, the network
// where NodePorts and resource fit would be); all but NodeName score.
func Default(snapshot func() framework.Snapshot, net *network.Plugin) *framework.Framework {
	fw := &framework.Framework{
		Snapshot: snapshot,
		Filters:  []framework.FilterPlugin{nodename.Plugin{}, tainttoleration.Plugin{}, nodeaffinity.Plugin{}},
		Scores: []framework.WeightedScore{
			{Plugin: tainttoleration.Plugin{}, Weight: WeightTaintToleration},
			{Plugin: nodeaffinity.Plugin{}, Weight: WeightNodeAffinity},
		},
	}
	if net != nil {
		fw.Filters = append(fw.Filters, net)
		fw.Scores = append(fw.Scores, framework.WeightedScore{Plugin: net, Weight: WeightNetwork})
	}
	spread := podtopologyspread.New()
	affinity := interpodaffinity.New()
	fw.Filters = append(fw.Filters, spread, affinity)
	fw.Scores = append(fw.Scores,
		framework.WeightedScore{Plugin: spread, Weight: WeightPodTopologySpread},
		framework.WeightedScore{Plugin: affinity, Weight: WeightInterPodAffinity})
	return fw
}
