package routing

import (
	"fmt"
	"os"
	"strings"
)

// sysctl sets /proc/sys/NAME to value in the current namespace unless it
// already holds it (writing some, like ip_forward, walks every device).
func sysctl(name, value string, c *Counts) error {
	path := "/proc/sys/" + name
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == value {
		c.Unchanged++
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	c.Updated++
	return nil
}

// forwarding turns on IP forwarding for the families s routes.
func (a *Applier) forwarding(s State, st *Stats) error {
	if s.IPv4Forwarding {
		if err := sysctl("net/ipv4/ip_forward", "1", &st.Sysctls); err != nil {
			return err
		}
	}
	if s.IPv6Forwarding {
		return sysctl("net/ipv6/conf/all/forwarding", "1", &st.Sysctls)
	}
	return nil
}

// tunnelSysctls make reverse-path filtering loose on a tunnel device
// (strict filtering drops packets that arrive encapsulated from a peer
// whose pods are routed natively, and the other way round).
func tunnelSysctls(dev string, v6 bool, c *Counts) error {
	if err := sysctl("net/ipv4/conf/"+dev+"/rp_filter", "2", c); err != nil {
		return err
	}
	if v6 {
		return sysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "0", c)
	}
	return nil
}
