# tabby: make build | make test | make e2e | make bench | make lab
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/tabbynet/tabby/internal/buildinfo.Version=$(VERSION)
BINS := tabby tabby-ipam tabbyd tabby-scheduler-extender tabbyctl
# grpcnotrace: gRPC (tabbyd's, through GoBGP) does not link
# golang.org/x/net/trace, whose init makes text/template reachable and so
# turns off the linker's removal of unused methods (deploy/Dockerfile builds
# with the same tags; TestDeadcode keeps it on).
BUILD_TAGS := grpcnotrace
# test/labtest ran 21 to 39 minutes on 2 loaded cores: the timeout leaves room
# for a slow machine, inside CI's 90 minutes.
GOTEST_FLAGS ?= -count=1 -timeout 60m

.PHONY: all build deps controlplane runtime upstream cnp-suite test test-ipip e2e e2e-upstream conformance-cnp bench lab generate check-generated vet clean

# What the tests and the lab run, built from the Go module proxy and cached
# by content in ~/.cache/tabby (see hack/lib/buildcache.sh): the folders the
# build scripts print.
LABENV = TABBY_CONTROLPLANE_DIR=$$(test/controlplane/build.sh) TABBY_RUNTIME_DIR=$$(test/runtime/build.sh) TABBY_BIN_DIR=$(CURDIR)/bin
UPSTREAMENV = $(LABENV) TABBY_E2E_DIR=$$(test/upstream/build.sh)
QEMUENV = TABBY_CONTROLPLANE_DIR=$$(test/controlplane/build.sh) TABBY_BIN_DIR=$(CURDIR)/bin
# IPIP under qemu (test/qemutest): its own step of make test, timed.
IPIP_TEST = start=$$SECONDS; $(QEMUENV) go test $(GOTEST_FLAGS) -v -run 'InQEMU$$' ./test/qemutest/; \
	rc=$$?; echo "==> IPIP under qemu (make test-ipip) took $$((SECONDS - start))s"; exit $$rc

all: build

## build: compile tabby's programs into ./bin, with the reference CNI plugins
## its image ships (loopback, portmap) from the module go.mod pins
build:
	@echo "==> building tabby's programs into ./bin"
	@mkdir -p bin
	CGO_ENABLED=0 go build -trimpath -tags '$(BUILD_TAGS)' -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINS))
	hack/build-cni-plugins.sh bin

## deps: install the Debian packages tests and the lab need (as root)
deps:
	@echo "==> Debian packages (hack/install-deps.sh)"
	@hack/install-deps.sh

## controlplane: build the Kubernetes programs (etcd, kube-apiserver, ...,
## kubelet, kube-proxy, agnhost, pause) from the Go module proxy
controlplane:
	@echo "==> Kubernetes v1.35.4 programs (test/controlplane/build.sh; cached)"
	@test/controlplane/build.sh >/dev/null

## runtime: build containerd v2 and CoreDNS from the Go module proxy
runtime:
	@echo "==> containerd and CoreDNS (test/runtime/build.sh; cached)"
	@test/runtime/build.sh >/dev/null

## upstream: build Kubernetes' e2e suite (e2e.test v1.35.4) from the Go
## module proxy
upstream: controlplane
	@echo "==> Kubernetes' e2e.test v1.35.4 (test/upstream/build.sh; cached)"
	@test/upstream/build.sh >/dev/null

## test: everything: unit tests, tests against the real API server,
## real-kernel and CNI end-to-end tests, the lab's real clusters, a
## subset of Kubernetes' own network e2e specs against one (TestUpstreamE2E),
## then IPIP under qemu (test-ipip)
test: deps build controlplane runtime upstream vet
	@echo "==> go test ./... (lab tests bring up real clusters and run Kubernetes' e2e subset: about 25 minutes on 2 cores)"
	@rc=0; $(UPSTREAMENV) go test $(GOTEST_FLAGS) $$(go list ./... | grep -v '/test/qemutest$$') || rc=1; \
	(cd test/schedcompare && go test $(GOTEST_FLAGS) ./...) || rc=1; \
	echo "==> IPIP under qemu: TestIPIPInQEMU, TestRoutingInQEMU (about 2 minutes)"; ($(IPIP_TEST)) || rc=1; exit $$rc

## test-ipip: IPIP Always and CrossSubnet pods on three tabbyd nodes inside
## a qemu VM (TCG) booting Debian's kernel, which has the ipip module this
## machine's lacks, against the control plane on the host (about 2 minutes;
## the first run also downloads and unpacks the kernel, cached by content)
test-ipip: deps build controlplane
	@echo "==> IPIP under qemu: TestIPIPInQEMU, TestRoutingInQEMU"
	@$(IPIP_TEST)

## e2e: the end-to-end suites only
e2e: deps build controlplane runtime
	$(LABENV) go test $(GOTEST_FLAGS) -v ./test/e2e/...

## bench: benchmarks against peers (see test/bench): ADD/DEL latency over 200
## interleaved iterations, then three bursts of 100 pods (1 to 2 minutes);
## then NetworkPolicy: full sync of 1,000 policies over 5,000 pods, rule
## count against policies and pods, 50 label flips end to end through
## tabbyd's controller, iperf3 with and without policies, 9 rounds, new
## connections a second through each dispatch layout, 5 rounds (about 8
## minutes);
## then route convergence, BGP sessions and tabbyd memory with 10 and 30
## nodes running tabbyd alone, full mesh against route reflectors, and IPv4
## against IPv6 blocks on 10 dual-stack nodes (about 3 minutes); pod start-up on 3 real nodes and what a node costs (about 2
## minutes); then the
## scheduler extender: filter+prioritize p50/p99 at 5,000 nodes and 50,000
## pods, and pods/s of the real kube-scheduler with and without it (1,000
## pods on 500 nodes, 3 interleaved rounds; about 2 minutes)
bench: deps build controlplane runtime
	export $(LABENV); \
	go test -count=1 -timeout 30m -run '^$$' -bench AddDel -benchtime 200x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench Burst -benchtime 3x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench NetpolFullSync -benchtime 3x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench NetpolRuleCount -benchtime 1x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench NetpolLabelFlip -benchtime 50x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench NetpolThroughput -benchtime 9x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench NetpolConnRate -benchtime 5x ./test/bench/... && \
	go test -count=1 -timeout 30m -run '^$$' -bench RouteConvergence -benchtime 1x ./test/bench/ && \
	go test -count=1 -timeout 30m -run '^$$' -bench PodStartup -benchtime 1x ./test/labtest/ && \
	go test -count=1 -timeout 30m -run '^$$' -bench BenchmarkExtender -benchtime 200x ./scheduler-extender/plugins/ && \
	go test -count=1 -timeout 30m -run '^$$' -bench SchedulingThroughput -benchtime 3x ./test/schedtest/

## e2e-upstream: Kubernetes' own NetworkPolicy suite (50 specs) and
## sig-network conformance specs (47) against a 3-node lab, then the table
## (about 25 minutes; UPSTREAM=netpol, conformance, ci or focus=REGEXP
## selects others)
UPSTREAM ?= all
e2e-upstream: deps build controlplane runtime upstream
	@echo "==> Kubernetes' e2e suites ($(UPSTREAM)) against a 3-node lab: reports in .cache/e2e-upstream/"
	$(UPSTREAMENV) go test -count=1 -timeout 4h -run '^TestUpstreamE2E$$' -v ./test/labtest/ -args -upstream='$(UPSTREAM)'

## cnp-suite: build the ClusterNetworkPolicy conformance suite of
## sigs.k8s.io/network-policy-api v0.3.0 from the Go module proxy
cnp-suite:
	@echo "==> the ClusterNetworkPolicy conformance suite (test/cnpconformance/build.sh; cached)"
	@test/cnpconformance/build.sh >/dev/null

## conformance-cnp: the ClusterNetworkPolicy conformance suite, unmodified,
## against a 2-node lab, then its table and report (CNP=standard or
## experimental; report in .cache/cnp-conformance/)
CNP ?= experimental
conformance-cnp: deps build controlplane runtime cnp-suite
	@echo "==> ClusterNetworkPolicy conformance ($(CNP)) against a 2-node lab: report in .cache/cnp-conformance/"
	$(LABENV) TABBY_CNP_DIR=$$(test/cnpconformance/build.sh) go test -count=1 -timeout 3h -run '^TestCNPConformance$$' -v ./test/labtest/ -args -cnp='$(CNP)'

## lab: the main job (see README): a real 3-node cluster with tabby, pods,
## a connectivity matrix, a Service by name, a NetworkPolicy and each node's
## BGP peers; the lab stays up (tabbyctl lab down)
lab: deps build controlplane runtime
	@echo "==> the lab: tabbyctl lab demo --nodes 3"
	$(LABENV) ./bin/tabbyctl lab demo --nodes 3

GOFILES = $$(find . -name '*.go' -not -path './.cache/*' -not -path './test/controlplane/*' -not -path './test/runtime/*' -not -path './test/upstream/*' -not -path './test/cnpconformance/*')

## vet: gofmt, go vet, and the generated code and CRDs match api/
vet: check-generated
	@test -z "$$(gofmt -l $(GOFILES))" || { gofmt -l $(GOFILES); echo "gofmt needed on the files above"; exit 1; }
	go vet ./...
	cd test/schedcompare && go vet ./...

.cache/controller-gen: hack/tools/go.mod hack/tools/go.sum
	@mkdir -p .cache
	cd hack/tools && go build -o $(CURDIR)/.cache/controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen

# UPSTREAM_CRDS are CRDs copied as they are from another project's module,
# not generated from api/: ClusterNetworkPolicy (sigs.k8s.io/network-policy-api
# v0.3.0, config/crd/experimental). Its Go types in api/cnp only mirror the
# module's for decoding, so CRDs are generated from api/v1 alone.
UPSTREAM_CRDS = policy.networking.k8s.io_*

## check-generated: fail when deploy/crds or the deepcopy code is stale
check-generated: .cache/controller-gen
	@rm -rf .cache/gen && mkdir -p .cache/gen/crds
	@.cache/controller-gen crd:crdVersions=v1,maxDescLen=400 paths=./api/v1/... output:crd:dir=.cache/gen/crds
	@diff -r -x '$(UPSTREAM_CRDS)' deploy/crds .cache/gen/crds >/dev/null || { diff -r -x '$(UPSTREAM_CRDS)' deploy/crds .cache/gen/crds | head -40; echo "deploy/crds is stale: run make generate"; exit 1; }
	@cp api/v1/zz_generated.deepcopy.go .cache/gen/deepcopy.go && .cache/controller-gen object paths=./api/... && \
	  { cmp -s api/v1/zz_generated.deepcopy.go .cache/gen/deepcopy.go || { cp .cache/gen/deepcopy.go api/v1/zz_generated.deepcopy.go; echo "api/v1/zz_generated.deepcopy.go is stale: run make generate"; exit 1; }; }

## generate: regenerate deepcopy code and CRD manifests from api/
generate: .cache/controller-gen
	.cache/controller-gen object paths=./api/...
	.cache/controller-gen crd:crdVersions=v1,maxDescLen=400 paths=./api/v1/... output:crd:dir=./deploy/crds
	go generate ./deploy

clean:
	rm -rf bin
