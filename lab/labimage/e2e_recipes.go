package labimage

import "slices"

// The images Kubernetes' e2e suites (e2e.test --list-images) run besides
// agnhost and pause, for the suites that run against the lab: the DNS
// specs' jessie-dnsutils, the EndpointSlice and Endpoints specs' nginx,
// and the framework's default busybox. The lab does not preload them (its
// start stays fast): the runner of the upstream suites builds them (cached
// by content, as the lab's own) and imports them with `tabbyctl lab load`.

// JessieDnsutilsRef is the image of the DNS specs' second querier.
const JessieDnsutilsRef = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7"

// JessieDnsutilsPackages are the Debian packages of JessieDnsutils: what
// upstream's image (debian:jessie with dnsutils) gives the DNS specs'
// shell loops (dash as /bin/sh, bash, dig and nslookup, getent, hostname,
// awk, seq, test, echo, sleep, grep, sed, find).
var JessieDnsutilsPackages = []string{
	"dash", "bash", "coreutils", "grep", "sed", "mawk", "findutils", "hostname",
	"bind9-dnsutils", "libc-bin",
}

// coreutilsLibs are the libraries of coreutils, grep, sed, bash and
// findutils on Debian 12.
var coreutilsLibs = []string{"libacl1", "libattr1", "libgmp10", "libselinux1", "libpcre2-8-0", "libssl3", "libtinfo6"}

// debianPasswd and debianGroup are a Debian base image's first accounts.
const (
	debianPasswd = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\nbin:x:2:2:bin:/bin:/usr/sbin/nologin\n" +
		"www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	debianGroup = "root:x:0:\ndaemon:x:1:\nbin:x:2:\nwww-data:x:33:\nnogroup:x:65534:\n"
)

// JessieDnsutils is JessieDnsutilsRef, built from Debian 12's packages
// (jessie's are long gone): JessieDnsutilsPackages with their libraries,
// Debian's /etc/passwd, /etc/group and nsswitch.conf, awk linked to mawk
// (the alternative its maintainer script would make), and, as upstream's,
// CoreDNS at /coredns when corednsPath is not "". No entrypoint: the specs
// give a command.
func JessieDnsutils(corednsPath string) Spec {
	s := Spec{
		Ref:  JessieDnsutilsRef,
		Debs: closure(JessieDnsutilsPackages, libc, coreutilsLibs, dnsutilsLibs),
		Files: []File{
			{Path: "/etc/passwd", Data: []byte(debianPasswd)},
			{Path: "/etc/group", Data: []byte(debianGroup)},
			{Path: "/etc/nsswitch.conf", Data: []byte(nsswitch)},
		},
		Symlinks: map[string]string{
			"/usr/bin/awk":  "mawk",
			"/usr/bin/nawk": "mawk",
			"/var/run":      "/run",
		},
		Dirs: append(slices.Clone(runDirs), Dir{Path: "/root", Mode: 0o700}),
		Cmd:  []string{"/bin/bash"},
	}
	if corednsPath != "" {
		s.Files = append(s.Files, File{Path: "/coredns", Src: corednsPath, Mode: 0o755})
	}
	return s
}

// NginxRef is the web server image of the Endpoints and EndpointSlice
// specs (and many kubectl specs).
const NginxRef = "registry.k8s.io/e2e-test-images/nginx:1.14-4"

// NginxPackages are the Debian packages of Nginx: the server with its
// configuration folder, and busybox for a shell and the usual tools, as
// upstream's Alpine-based image has them.
var NginxPackages = []string{"nginx", "nginx-common", "busybox"}

// nginxLibs are nginx's libraries on Debian 12.
var nginxLibs = []string{"libcrypt1", "libpcre2-8-0", "libssl3", "zlib1g"}

// nginxConf and nginxDefault are upstream's configuration (the nginx
// image's nginx.conf and conf.d/default.conf), with its logs on the
// container's standard output and error as that image links them.
const (
	nginxConf = `user  nginx;
worker_processes  auto;

error_log  /dev/stderr notice;
pid        /run/nginx.pid;

events {
    worker_connections  1024;
}

http {
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;

    log_format  main  '$remote_addr - $remote_user [$time_local] "$request" '
                      '$status $body_bytes_sent "$http_referer" '
                      '"$http_user_agent" "$http_x_forwarded_for"';

    access_log  /dev/stdout  main;

    sendfile        on;
    keepalive_timeout  65;

    include /etc/nginx/conf.d/*.conf;
}
`
	nginxDefault = `server {
    listen       80;
    listen  [::]:80;
    server_name  localhost;

    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }

    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
`
	nginxPasswd = "root:x:0:0:root:/root:/bin/sh\nnginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
	nginxGroup  = "root:x:0:\nnginx:x:101:nginx\nnogroup:x:65534:\n"
)

// Nginx is NginxRef, built from Debian 12's nginx (1.22) instead of
// upstream's Alpine one: a web server on port 80 serving
// /usr/share/nginx/html, run as upstream's is (nginx -g 'daemon off;',
// workers as the user nginx), busybox's applets for the shell tools.
func Nginx() Spec {
	return Spec{
		Ref:  NginxRef,
		Debs: closure(NginxPackages, libc, nginxLibs),
		Files: []File{
			{Path: "/etc/nginx/nginx.conf", Data: []byte(nginxConf)},
			{Path: "/etc/nginx/conf.d/default.conf", Data: []byte(nginxDefault)},
			{Path: "/usr/share/nginx/html/50x.html", Data: []byte("<!DOCTYPE html>\n<html><head><title>Error</title></head><body><h1>An error occurred.</h1></body></html>\n")},
			{Path: "/etc/passwd", Data: []byte(nginxPasswd)},
			{Path: "/etc/group", Data: []byte(nginxGroup)},
			{Path: "/etc/nsswitch.conf", Data: []byte(nsswitch)},
		},
		Symlinks: map[string]string{"/var/run": "/run"},
		Dirs: append(slices.Clone(runDirs),
			Dir{Path: "/var/cache/nginx"}, Dir{Path: "/var/lib/nginx"}, Dir{Path: "/var/log/nginx"}, Dir{Path: "/root", Mode: 0o700}),
		Busybox: "/bin/busybox",
		Cmd:     []string{"nginx", "-g", "daemon off;"},
		Ports:   []string{"80"},
	}
}

// BusyboxRef is the framework's default image (e2epod.MakePodSpec) and
// several specs' shell.
const BusyboxRef = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"

// Busybox is BusyboxRef as upstream's (the busybox image: one static
// busybox with every applet, command sh), from Debian's busybox-static.
func Busybox() Spec {
	return Spec{
		Ref:  BusyboxRef,
		Debs: []string{"busybox-static"},
		Files: []File{
			{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
			{Path: "/etc/group", Data: []byte("root:x:0:\ndaemon:x:1:\nnogroup:x:65534:\n")},
		},
		Symlinks: map[string]string{"/var/run": "/run"},
		Dirs:     append(slices.Clone(runDirs), Dir{Path: "/root", Mode: 0o700}, Dir{Path: "/home"}),
		Busybox:  "/bin/busybox",
		Cmd:      []string{"sh"},
	}
}

// E2EImages are the specs of the images Kubernetes' network e2e suites
// need that the lab does not preload, corednsPath as JessieDnsutils takes
// it.
func E2EImages(corednsPath string) []Spec {
	return []Spec{JessieDnsutils(corednsPath), Nginx(), Busybox()}
}
