package lab

import (
	"net"
	"strings"
	"testing"
)

// TestPreflightSaysWhatIsMissing: without the commands the lab runs on
// PATH, lab up stops before it starts anything and names each one with
// the Debian package that has it; a taken --api-port is named too.
func TestPreflightSaysWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := preflight(&Options{Runtime: RuntimeContainerd})
	if err == nil {
		t.Fatal("preflight passed with an empty PATH")
	}
	for _, want := range []string{"nsenter (Debian package util-linux)", "unshare (Debian package util-linux)",
		"iptables (Debian package iptables)", "hack/install-deps.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %q:\n%v", want, err)
		}
	}
}

func TestPreflightPortTaken(t *testing.T) {
	if cgroupsMissing() != "" || preflight(&Options{Runtime: RuntimeContainerd}) != nil {
		t.Skip("this machine lacks what the lab needs; TestPreflightSaysWhatIsMissing covers that")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	err = preflight(&Options{Runtime: RuntimeContainerd, APIPort: port})
	if err == nil || !strings.Contains(err.Error(), "is taken") || !strings.Contains(err.Error(), "--api-port") {
		t.Errorf("a taken API port: %v", err)
	}
}
