// Package schedcompare holds the tests that compare tabby-scheduler-extender
// with kube-scheduler v1.35's own plugins (NodeAffinity, TaintToleration,
// PodTopologySpread, InterPodAffinity), built from the Go module proxy. A
// module of its own, so that tabby's go.mod never imports k8s.io/kubernetes.
package schedcompare
