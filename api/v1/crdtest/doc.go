// Package crdtest checks tabby's CRDs (deploy/crds) and admission policies
// (deploy/policies) against a real kube-apiserver: every type round-trips
// with every field, and invalid objects are refused with the messages the
// Go validation in api/v1 gives. It holds only tests; they need root and
// the control plane of test/controlplane (see internal/controlplane/clustertest).
package crdtest
