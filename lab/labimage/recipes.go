package labimage

import (
	_ "embed"
	"path/filepath"
	"slices"
)

// TabbyPackages are the Debian packages of the tabby image, as
// deploy/Dockerfile installs them on debian:bookworm-slim: the tools tabbyd
// drives, and coreutils (bookworm-slim's own) for the sleep of
// deploy/tabbyctl-pod.yaml.
var TabbyPackages = []string{"iptables", "ipset", "iproute2", "kmod", "coreutils"}

// TabbyBinaries are the programs of the tabby image, in /usr/local/bin:
// install-cni copies the CNI plugins from the folder tabbyctl runs from.
var TabbyBinaries = []string{"tabby", "tabby-ipam", "tabbyd", "tabbyctl", "tabby-scheduler-extender", "loopback", "portmap"}

// Libraries, by the packages that need them: Debian 12's dependency
// closures without what only maintainer scripts use (debconf, dpkg, perl,
// libcap2-bin's setcap, install-info) and without gcc-12-base (only
// documentation). Build's ELF check keeps these lists honest.
var (
	libc         = []string{"libc6", "libgcc-s1"}
	iptablesLibs = []string{"libip4tc2", "libip6tc2", "libmnl0", "libnetfilter-conntrack3", "libnfnetlink0", "libnftnl11", "libxtables12", "netbase"}
	ipsetLibs    = []string{"libipset13", "libmnl0"}
	iproute2Libs = []string{
		"libbpf1", "libelf1", "zlib1g", "libbsd0", "libmd0", "libcap2", "libdb5.3", "libmnl0", "libxtables12",
		"libselinux1", "libpcre2-8-0",
		"libatm1", // tc's ATM qdisc module, a Recommends of iproute2
		// libtirpc3 (for arpd's and rtacct's RPC) brings Kerberos.
		"libtirpc3", "libtirpc-common", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libcom-err2", "libkrb5support0", "libkeyutils1", "libssl3",
	}
	kmodLibs = []string{"libkmod2", "liblzma5", "libssl3", "libzstd1"}
	curlLibs = []string{
		"libcurl4", "libbrotli1", "libidn2-0", "libunistring2", "libldap-2.5-0", "libsasl2-2", "libsasl2-modules-db", "libdb5.3",
		"libnghttp2-14", "libpsl5", "libssh2-1", "libssl3", "libzstd1", "zlib1g",
		"libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libcom-err2", "libkrb5support0", "libkeyutils1",
		// librtmp1 brings GnuTLS.
		"librtmp1", "libgnutls30", "libhogweed6", "libnettle8", "libgmp10", "libp11-kit0", "libffi8", "libtasn1-6",
	}
	// dnsutilsLibs are dig's: BIND's libraries bring libxml2, and libxml2
	// ICU's 30 MB of data, the larger part of the agnhost image.
	dnsutilsLibs = []string{
		"bind9-host", "bind9-libs", "libuv1", "libfstrm0", "libjemalloc2", "libjson-c5", "liblmdb0", "libmaxminddb0", "libprotobuf-c1",
		"libxml2", "libicu72", "libstdc++6", "liblzma5", "libedit2", "libtinfo6", "libbsd0", "libmd0", "libidn2-0", "libunistring2",
		"libnghttp2-14", "libssl3", "zlib1g", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libcom-err2", "libkrb5support0", "libkeyutils1",
	}
	conntrackLibs = []string{"libmnl0", "libnetfilter-conntrack3", "libnfnetlink0"}
	nftablesLibs  = []string{"libnftables1", "libedit2", "libtinfo6", "libbsd0", "libmd0", "libgmp10", "libjansson4", "libmnl0", "libnftnl11", "libxtables12"}
)

// closure joins package lists without repeats, sorted.
func closure(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nftLinks are the links Debian's alternatives make for the nft backend of
// iptables (the host's, and every iptables user on a node must agree).
func nftLinks() map[string]string {
	m := map[string]string{}
	for _, t := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		m["/usr/sbin/"+t] = "xtables-nft-multi"
	}
	return m
}

// runDirs are the folders a Debian-based image has for programs that lock
// or write temporary files (iptables' /run/xtables.lock).
var runDirs = []Dir{{Path: "/tmp", Mode: 0o1777}, {Path: "/run"}, {Path: "/var/tmp", Mode: 0o1777}}

// Tabby is the tabby image (ghcr.io/tabbynet/tabby:VERSION), as
// deploy/Dockerfile builds it: TabbyBinaries from binDir in
// /usr/local/bin, and TabbyPackages with their libraries.
func Tabby(binDir, version string) Spec {
	s := Spec{
		Ref:      "ghcr.io/tabbynet/tabby:" + version,
		Debs:     closure(TabbyPackages, libc, iptablesLibs, ipsetLibs, iproute2Libs, kmodLibs, coreutilsLibs),
		Symlinks: nftLinks(),
		Dirs:     slices.Clone(runDirs),
	}
	s.Symlinks["/var/run"] = "/run"
	for _, b := range TabbyBinaries {
		s.Files = append(s.Files, File{Path: "/usr/local/bin/" + b, Src: filepath.Join(binDir, b), Mode: 0o755})
	}
	return s
}

// KubeProxyRef is the kube-proxy image of the lab's Kubernetes.
const KubeProxyRef = "registry.k8s.io/kube-proxy:v1.35.4"

// KubeProxy is KubeProxyRef: kube-proxy in /usr/local/bin with the
// programs its modes run (iptables with the nft links, ipset, conntrack,
// kmod, and nft for --proxy-mode=nftables). Like upstream's, the image has
// no entrypoint: the DaemonSet names /usr/local/bin/kube-proxy.
func KubeProxy(kubeProxyPath string) Spec {
	s := Spec{
		Ref:      KubeProxyRef,
		Debs:     closure([]string{"iptables", "ipset", "conntrack", "kmod", "nftables"}, libc, iptablesLibs, ipsetLibs, conntrackLibs, kmodLibs, nftablesLibs),
		Files:    []File{{Path: "/usr/local/bin/kube-proxy", Src: kubeProxyPath, Mode: 0o755}},
		Symlinks: nftLinks(),
		Dirs:     slices.Clone(runDirs),
	}
	s.Symlinks["/var/run"] = "/run"
	return s
}

// AgnhostRef is the agnhost image Kubernetes 1.35's e2e suites run.
const AgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.59"

// agnhostPasswd and agnhostGroup carry the user and group that upstream's
// image defines for the SupplementalGroups e2e test.
const (
	agnhostPasswd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
	agnhostGroup  = "root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
)

// AgnhostPackages are the Debian packages of the agnhost image, for the
// tools Kubernetes' e2e tests run inside it, as upstream's Alpine image has
// them: busybox (sh, cat, sleep, hostname, nslookup, wget, ping, seq ...),
// netcat-openbsd (nc), iproute2 (ip, ss), curl (DialFromContainer and the
// hostPort tests), bind9-dnsutils (dig, for the DNS tests' probes; with
// ICU it is more than half of the image), libc-bin (getent) and bash
// (the ClusterNetworkPolicy conformance suite starts its servers with
// /bin/bash -c).
//
// Debian's busybox, not busybox-static: the static build's shell runs its
// own applets before PATH (a busybox "standalone shell"), so sh -c "nc …"
// or "ip …" would get busybox's nc and ip instead of the real ones.
var AgnhostPackages = []string{"busybox", "netcat-openbsd", "iproute2", "curl", "bind9-dnsutils", "libc-bin", "bash"}

// agnhost's porter serves TLS (the Proxy conformance test asks it to) with
// the certificate and key in its working folder, as upstream's image has
// them: a self-signed pair for 127.0.0.1, ::1 and localhost, made for this
// test image only (openssl req -x509 -newkey ec, valid for 100 years).
var (
	//go:embed agnhost-localhost.crt
	porterCert []byte
	//go:embed agnhost-localhost.key
	porterKey []byte
)

// nsswitch is Debian's /etc/nsswitch.conf for files and DNS.
const nsswitch = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"

// Agnhost is AgnhostRef as upstream lays it out (/agnhost, its link
// /agnhost-2, /uploads, porter's /localhost.crt and /localhost.key,
// entrypoint /agnhost with command pause, the ports it exposes, the user
// and group the e2e tests expect) with
// AgnhostPackages and their libraries; busybox's applets are links in the
// bin folders, except where a package has the real program.
func Agnhost(agnhostPath string) Spec {
	return Spec{
		Ref:  AgnhostRef,
		Debs: closure(AgnhostPackages, libc, iproute2Libs, curlLibs, dnsutilsLibs),
		Files: []File{
			{Path: "/agnhost", Src: agnhostPath, Mode: 0o755},
			{Path: "/etc/passwd", Data: []byte(agnhostPasswd)},
			{Path: "/etc/group", Data: []byte(agnhostGroup)},
			// libc-bin's maintainer script would install it.
			{Path: "/etc/nsswitch.conf", Data: []byte(nsswitch)},
			{Path: "/localhost.crt", Data: porterCert},
			{Path: "/localhost.key", Data: porterKey},
		},
		Symlinks: map[string]string{
			"/agnhost-2":      "agnhost",
			"/usr/bin/nc":     "nc.openbsd",
			"/usr/bin/netcat": "nc.openbsd",
			"/var/run":        "/run",
		},
		Dirs:       append(slices.Clone(runDirs), Dir{Path: "/uploads"}, Dir{Path: "/root", Mode: 0o700}),
		Busybox:    "/bin/busybox",
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Ports:      []string{"80", "8080", "8081", "9376", "5000"},
	}
}

// PauseRef is the pause image the lab preloads.
const PauseRef = "registry.k8s.io/pause:3.10.1"

// Pause is the pause image ref (PauseRef, or the tag a node's containerd
// is configured for) as upstream builds it: the single static /pause,
// entrypoint /pause, user 65535:65535.
func Pause(pausePath, ref string) Spec {
	return Spec{
		Ref:        ref,
		Files:      []File{{Path: "/pause", Src: pausePath, Mode: 0o755}},
		Entrypoint: []string{"/pause"},
		User:       "65535:65535",
	}
}

// CoreDNS is the CoreDNS image ref (registry.k8s.io/coredns/coredns with
// the tag the lab's manifest names) as upstream builds it on
// distroless static: the static /coredns, entrypoint /coredns, user
// nonroot (65532), working folder /, ports 53 and 53/udp. The Deployment
// gives it NET_BIND_SERVICE for port 53, as kubeadm's does.
func CoreDNS(corednsPath, ref string) Spec {
	return Spec{
		Ref: ref,
		Files: []File{
			// As upstream's image (setcap cap_net_bind_service=+ep): it
			// runs as 65532 and binds port 53, also where the runtime
			// does not open low ports to every user (containerd 1.6).
			{Path: "/coredns", Src: corednsPath, Mode: 0o755, Capabilities: []Capability{CapNetBindService}},
			{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
			{Path: "/etc/group", Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		},
		Dirs:       []Dir{{Path: "/tmp", Mode: 0o1777}},
		Entrypoint: []string{"/coredns"},
		User:       "65532:65532",
		WorkingDir: "/",
		Ports:      []string{"53/tcp", "53/udp"},
	}
}
