//go:build tools

// Package tools pins sigs.k8s.io/network-policy-api's conformance suite and
// every package its tests import, so that `go mod tidy` keeps what `go test
// -c sigs.k8s.io/network-policy-api/conformance` needs.
package tools

import (
	_ "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	_ "sigs.k8s.io/controller-runtime/pkg/client/config"
	_ "sigs.k8s.io/network-policy-api/apis/v1beta1"
	_ "sigs.k8s.io/network-policy-api/conformance"
	_ "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	_ "sigs.k8s.io/network-policy-api/conformance/tests"
	_ "sigs.k8s.io/network-policy-api/conformance/utils/flags"
	_ "sigs.k8s.io/network-policy-api/conformance/utils/suite"
	_ "sigs.k8s.io/yaml"
)
