package v1

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validation messages. They are the messages of the CRDs' CEL rules (the
// x-kubernetes-validations markers on the types), so that a user sees the
// same words from kubectl, tabbyctl and tabby's logs; validate_test.go
// checks that deploy/crds carries each of them.
const (
	MsgCIDRInvalid       = "cidr must be a network in CIDR notation, such as 10.244.0.0/16 or fd00:10:244::/56"
	MsgCIDRHostBits      = "cidr has host bits set: write the network address (for example 10.244.0.0/16, not 10.244.1.0/16)"
	MsgBlockSizeRange    = "blockSize is out of range: use 20 to 32 for an IPv4 pool and 116 to 128 for an IPv6 pool (the defaults are 26 and 122)"
	MsgBlockSizeTooSmall = "blockSize is smaller than the pool's prefix length, so one block would not fit in the pool: set blockSize to at least the CIDR's prefix length, or use a larger CIDR"
	MsgIPIPAndVXLAN      = "ipipMode and vxlanMode cannot both be enabled on one pool: set one of them to Never"

	MsgIPAMConfigurationName = "tabby reads only the IPAMConfiguration named default: name it default"

	MsgBGPPeerNodeAndSelector = "set node or nodeSelector, not both"
	MsgBGPPeerIPOrSelector    = "set exactly one of peerIP (with asNumber) and peerSelector"
	MsgBGPPeerNeedsASNumber   = "a peer given by peerIP needs its asNumber"
	MsgBGPPeerIP              = "peerIP must be an IP address, IPv4:port or [IPv6]:port, with a port from 1 to 65535"

	MsgRouteReflectorClusterID = "routeReflectorClusterID must be written as an IPv4 address, such as 244.0.0.1"
	MsgServiceCIDR             = "cidr must be in CIDR notation"

	MsgFilterCIDRAndOperator = "set cidr and matchOperator together, or neither to match every route"
	MsgFilterCIDRv4          = "cidr must be an IPv4 CIDR such as 10.0.0.0/8"
	MsgFilterCIDRv6          = "cidr must be an IPv6 CIDR such as fd00::/8"
)

// Block size limits (prefix lengths) per family.
const (
	MinBlockSizeV4 = 20
	MaxBlockSizeV4 = 32
	MinBlockSizeV6 = 116
	MaxBlockSizeV6 = 128
)

// The messages of the IPPool rules that name the values at fault (the CEL
// rules' messageExpressions say the same).

func msgCIDRHostBits(cidr string, masked netip.Prefix) string {
	return "cidr " + cidr + " has host bits set: write the network address, " + masked.String()
}

func msgBlockSizeRange(blockSize, family int) string {
	use := "20 to 32 (the default is 26)"
	if family == 6 {
		use = "116 to 128 (the default is 122)"
	}
	return fmt.Sprintf("blockSize %d is out of range for an IPv%d pool: use %s", blockSize, family, use)
}

func msgBlockSizeTooSmall(blockSize int, set bool, cidr string, prefixLen int) string {
	what := fmt.Sprintf("blockSize %d", blockSize)
	if !set {
		what = fmt.Sprintf("the default blockSize %d", blockSize)
	}
	return fmt.Sprintf("%s is smaller than the prefix length of cidr %s, so one block would not fit in the pool: set blockSize to at least %d, or use a larger cidr", what, cidr, prefixLen)
}

// parseCIDR parses a CIDR as the API server's CEL cidr() does: netip
// syntax, no IPv4-mapped IPv6 address. Host bits may be set.
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("IPv4-mapped IPv6 address %q is not allowed", s)
	}
	return p, nil
}

// parseIP parses an address as CEL's ip() does: no zone, no IPv4-mapped
// IPv6 address.
func parseIP(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.Is4In6() {
		return netip.Addr{}, false
	}
	return a, true
}

// Prefix is the pool's CIDR, or an error when it is not one.
func (p *IPPool) Prefix() (netip.Prefix, error) {
	pfx, err := parseCIDR(p.Spec.CIDR)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("IPPool %s: %s (it is %q)", p.Name, MsgCIDRInvalid, p.Spec.CIDR)
	}
	return pfx, nil
}

// ParsedCIDR is the pool's CIDR as a net.IPNet (its network address, with
// an IPv4 pool's address in 4-byte form).
func (p *IPPool) ParsedCIDR() (*net.IPNet, error) {
	pfx, err := p.Prefix()
	if err != nil {
		return nil, err
	}
	pfx = pfx.Masked()
	return &net.IPNet{IP: net.IP(pfx.Addr().AsSlice()), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())}, nil
}

// Family is 4 or 6 for the family of the pool's CIDR, 0 when the CIDR is
// not valid.
func (p *IPPool) Family() int {
	pfx, err := parseCIDR(p.Spec.CIDR)
	if err != nil {
		return 0
	}
	if pfx.Addr().Is4() {
		return 4
	}
	return 6
}

// EffectiveBlockSize is the pool's blockSize, or when unset the default of
// its family (26 for IPv4, 122 for IPv6; 26 when the CIDR is not valid).
func (p *IPPool) EffectiveBlockSize() int {
	if p.Spec.BlockSize != 0 {
		return p.Spec.BlockSize
	}
	if p.Family() == 6 {
		return DefaultBlockSizeV6
	}
	return DefaultBlockSizeV4
}

// AllowsUse reports whether the pool's addresses may be used for use; an
// empty use means Workload, and a pool without allowedUses allows both.
func (p *IPPool) AllowsUse(use IPPoolAllowedUse) bool {
	if use == "" {
		use = UseWorkload
	}
	if len(p.Spec.AllowedUses) == 0 {
		return use == UseWorkload || use == UseTunnel
	}
	for _, u := range p.Spec.AllowedUses {
		if u == use {
			return true
		}
	}
	return false
}

// IPIPEnabled and VXLANEnabled report whether the pool encapsulates.
func (p *IPPool) IPIPEnabled() bool  { return p.Spec.IPIPMode != "" && p.Spec.IPIPMode != EncapNever }
func (p *IPPool) VXLANEnabled() bool { return p.Spec.VXLANMode != "" && p.Spec.VXLANMode != EncapNever }

// Overlaps reports whether two pools' CIDRs share an address (never across
// families; false when either CIDR is not valid).
func (p *IPPool) Overlaps(o *IPPool) bool {
	a, err1 := parseCIDR(p.Spec.CIDR)
	b, err2 := parseCIDR(o.Spec.CIDR)
	return err1 == nil && err2 == nil && a.Masked().Overlaps(b.Masked())
}

// Validate checks an IPPool as the API server does (the CRD schema and its
// CEL rules) and returns every problem in one error, in the API server's
// words, or nil. It does not look at other pools (see Overlaps) or blocks.
func (p *IPPool) Validate() error {
	return wrap("IPPool", p.Name, p.validate())
}

func (p *IPPool) validate() field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	s := &p.Spec
	pfx, err := parseCIDR(s.CIDR)
	switch {
	case s.CIDR == "":
		errs = append(errs, field.Required(spec.Child("cidr"), MsgCIDRInvalid))
	case err != nil:
		errs = append(errs, field.Invalid(spec.Child("cidr"), s.CIDR, MsgCIDRInvalid))
	case pfx != pfx.Masked():
		errs = append(errs, field.Invalid(spec.Child("cidr"), s.CIDR, msgCIDRHostBits(s.CIDR, pfx.Masked())))
	}
	errs = append(errs, validateEncap(spec.Child("ipipMode"), s.IPIPMode)...)
	errs = append(errs, validateEncap(spec.Child("vxlanMode"), s.VXLANMode)...)
	errs = append(errs, validateSelector(spec.Child("nodeSelector"), s.NodeSelector)...)
	seen := map[IPPoolAllowedUse]bool{}
	for i, u := range s.AllowedUses {
		path := spec.Child("allowedUses").Index(i)
		switch {
		case u != UseWorkload && u != UseTunnel:
			errs = append(errs, field.NotSupported(path, u, []string{string(UseWorkload), string(UseTunnel)}))
		case seen[u]:
			errs = append(errs, field.Duplicate(path, u))
		}
		seen[u] = true
	}
	// The rules on the whole spec, as the CRD's: skipped when cidr is bad.
	if err == nil {
		family, bits := 4, pfx.Addr().BitLen()
		if bits == 128 {
			family = 6
		}
		if s.BlockSize != 0 {
			lo, hi := MinBlockSizeV4, MaxBlockSizeV4
			if family == 6 {
				lo, hi = MinBlockSizeV6, MaxBlockSizeV6
			}
			if s.BlockSize < lo || s.BlockSize > hi {
				errs = append(errs, field.Invalid(spec, field.OmitValueType{}, msgBlockSizeRange(s.BlockSize, family)))
			}
		}
		if eff := p.EffectiveBlockSize(); eff < pfx.Bits() {
			errs = append(errs, field.Invalid(spec, field.OmitValueType{}, msgBlockSizeTooSmall(eff, s.BlockSize != 0, s.CIDR, pfx.Bits())))
		}
	}
	if p.IPIPEnabled() && p.VXLANEnabled() {
		errs = append(errs, field.Invalid(spec, field.OmitValueType{}, MsgIPIPAndVXLAN))
	}
	return errs
}

func validateEncap(path *field.Path, m EncapMode) field.ErrorList {
	switch m {
	case "", EncapNever, EncapAlways, EncapCrossSubnet:
		return nil
	}
	return field.ErrorList{field.NotSupported(path, m, []string{string(EncapNever), string(EncapAlways), string(EncapCrossSubnet)})}
}

func validateSelector(path *field.Path, sel *metav1.LabelSelector) field.ErrorList {
	if sel == nil {
		return nil
	}
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		return field.ErrorList{field.Invalid(path, sel, err.Error())}
	}
	return nil
}

func wrap(kind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return &ValidationError{Kind: kind, Name: name, Errors: errs}
}

// ValidationError lists what is wrong with one object.
//
// +kubebuilder:object:generate=false
type ValidationError struct {
	Kind, Name string
	Errors     field.ErrorList
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q is invalid: ", e.Kind, e.Name)
	for i, err := range e.Errors {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

// Validate checks a BGPPeer as the API server does.
func (p *BGPPeer) Validate() error {
	return wrap("BGPPeer", p.Name, p.Spec.validate(field.NewPath("spec")))
}

func (s *BGPPeerSpec) validate(spec *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s.PeerIP != "" {
		if _, _, err := ParsePeerIP(s.PeerIP); err != nil {
			errs = append(errs, field.Invalid(spec.Child("peerIP"), s.PeerIP, MsgBGPPeerIP))
		}
	}
	if s.SourceAddress != "" && s.SourceAddress != "UseNodeIP" && s.SourceAddress != "None" {
		errs = append(errs, field.NotSupported(spec.Child("sourceAddress"), s.SourceAddress, []string{"UseNodeIP", "None"}))
	}
	errs = append(errs, validateSelector(spec.Child("nodeSelector"), s.NodeSelector)...)
	errs = append(errs, validateSelector(spec.Child("peerSelector"), s.PeerSelector)...)
	errs = append(errs, validateSecretKeyRef(spec.Child("password"), s.Password)...)
	if s.Node != "" && s.NodeSelector != nil {
		errs = append(errs, field.Invalid(spec, field.OmitValueType{}, MsgBGPPeerNodeAndSelector))
	}
	if (s.PeerSelector != nil) == (s.PeerIP != "") {
		errs = append(errs, field.Invalid(spec, field.OmitValueType{}, MsgBGPPeerIPOrSelector))
	}
	if s.PeerIP != "" && s.ASNumber == 0 {
		errs = append(errs, field.Invalid(spec, field.OmitValueType{}, MsgBGPPeerNeedsASNumber))
	}
	return errs
}

func validateSecretKeyRef(path *field.Path, r *SecretKeyRef) field.ErrorList {
	if r == nil {
		return nil
	}
	var errs field.ErrorList
	if r.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), "the name of the Secret"))
	}
	if r.Key == "" {
		errs = append(errs, field.Required(path.Child("key"), "the key in the Secret's data"))
	}
	return errs
}

// ParsePeerIP splits a BGPPeer's peerIP ("IP", "IPv4:port" or
// "[IPv6]:port") into the address and the port (0 when none is given: use
// the BGP port, 179).
func ParsePeerIP(s string) (netip.Addr, uint16, error) {
	if a, ok := parseIP(s); ok {
		return a, 0, nil
	}
	bad := fmt.Errorf("%s (it is %q)", MsgBGPPeerIP, s)
	var host, port string
	if strings.HasPrefix(s, "[") {
		i := strings.Index(s, "]:")
		if i <= 1 {
			return netip.Addr{}, 0, bad
		}
		host, port = s[1:i], s[i+2:]
	} else {
		i := strings.Index(s, ":")
		if i <= 0 {
			return netip.Addr{}, 0, bad
		}
		host, port = s[:i], s[i+1:]
	}
	a, ok := parseIP(host)
	if !ok || (strings.HasPrefix(s, "[") && !a.Is6()) {
		return netip.Addr{}, 0, bad
	}
	if len(port) < 1 || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return netip.Addr{}, 0, bad
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return netip.Addr{}, 0, bad
	}
	return a, uint16(n), nil
}

// Validate checks a BGPConfiguration as the API server does.
func (c *BGPConfiguration) Validate() error {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if id := c.Spec.RouteReflectorClusterID; id != "" {
		if a, ok := parseIP(id); !ok || !a.Is4() {
			errs = append(errs, field.Invalid(spec.Child("routeReflectorClusterID"), id, MsgRouteReflectorClusterID))
		}
	}
	for name, l := range map[string][]ServiceIPBlock{
		"serviceClusterIPs":      c.Spec.ServiceClusterIPs,
		"serviceExternalIPs":     c.Spec.ServiceExternalIPs,
		"serviceLoadBalancerIPs": c.Spec.ServiceLoadBalancerIPs,
	} {
		for i, b := range l {
			if _, err := parseCIDR(b.CIDR); err != nil {
				errs = append(errs, field.Invalid(spec.Child(name).Index(i).Child("cidr"), b.CIDR, MsgServiceCIDR))
			}
		}
	}
	errs = append(errs, validateSecretKeyRef(spec.Child("nodeMeshPassword"), c.Spec.NodeMeshPassword)...)
	return wrap("BGPConfiguration", c.Name, errs)
}

// Validate checks an IPAMConfiguration as the API server does.
func (c *IPAMConfiguration) Validate() error {
	var errs field.ErrorList
	if c.Name != IPAMConfigurationName {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), c.Name, MsgIPAMConfigurationName))
	}
	if c.Spec.MaxBlocksPerHost < 0 {
		errs = append(errs, field.Invalid(field.NewPath("spec", "maxBlocksPerHost"), c.Spec.MaxBlocksPerHost, "should be greater than or equal to 0"))
	}
	return wrap("IPAMConfiguration", c.Name, errs)
}

// Validate checks a BGPFilter as the API server does.
func (f *BGPFilter) Validate() error {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	for _, l := range []struct {
		name  string
		rules []BGPFilterRuleV4
	}{{"importV4", f.Spec.ImportV4}, {"exportV4", f.Spec.ExportV4}} {
		for i, r := range l.rules {
			errs = append(errs, validateFilterRule(spec.Child(l.name).Index(i), r.CIDR, r.MatchOperator, r.Action, 4)...)
		}
	}
	for _, l := range []struct {
		name  string
		rules []BGPFilterRuleV6
	}{{"importV6", f.Spec.ImportV6}, {"exportV6", f.Spec.ExportV6}} {
		for i, r := range l.rules {
			errs = append(errs, validateFilterRule(spec.Child(l.name).Index(i), r.CIDR, r.MatchOperator, r.Action, 6)...)
		}
	}
	return wrap("BGPFilter", f.Name, errs)
}

func validateFilterRule(path *field.Path, cidr string, op BGPFilterMatchOperator, action BGPFilterAction, family int) field.ErrorList {
	var errs field.ErrorList
	if (cidr == "") != (op == "") {
		errs = append(errs, field.Invalid(path, field.OmitValueType{}, MsgFilterCIDRAndOperator))
	}
	if cidr != "" {
		p, err := parseCIDR(cidr)
		if err != nil || p.Addr().Is4() != (family == 4) {
			msg := MsgFilterCIDRv4
			if family == 6 {
				msg = MsgFilterCIDRv6
			}
			errs = append(errs, field.Invalid(path.Child("cidr"), cidr, msg))
		}
	}
	if op != "" && op != MatchEqual && op != MatchIn && op != MatchNotIn {
		errs = append(errs, field.NotSupported(path.Child("matchOperator"), op, []BGPFilterMatchOperator{MatchEqual, MatchIn, MatchNotIn}))
	}
	if action != FilterAccept && action != FilterReject {
		errs = append(errs, field.NotSupported(path.Child("action"), action, []BGPFilterAction{FilterAccept, FilterReject}))
	}
	return errs
}
