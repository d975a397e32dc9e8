package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// DefaultPoolName names the IPv4 pool tabbyd creates when the cluster has
// no IPv4 pool (Config.DefaultIPv4Pool); DefaultIPv6PoolName the IPv6 one
// (Config.DefaultIPv6Pool).
const (
	DefaultPoolName     = "default-ipv4"
	DefaultIPv6PoolName = "default-ipv6"
)

// Encapsulations of the default pool, as Calico's operator names them.
var Encapsulations = []string{"None", "IPIP", "IPIPCrossSubnet", "VXLAN", "VXLANCrossSubnet"}

// DefaultPoolSpec is the spec of the default IPv4 pool: cidr, block size
// (0: the default) and one of Encapsulations; NAT outgoing on, as in
// Calico's default pool.
func DefaultPoolSpec(cidr string, blockSize int, encapsulation string) (*tabbyv1.IPPoolSpec, error) {
	if err := cidrOfFamily(cidr, true); err != nil {
		return nil, err
	}
	spec := &tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize, NATOutgoing: true}
	switch encapsulation {
	case "", "None":
	case "IPIP":
		spec.IPIPMode = tabbyv1.EncapAlways
	case "IPIPCrossSubnet":
		spec.IPIPMode = tabbyv1.EncapCrossSubnet
	case "VXLAN":
		spec.VXLANMode = tabbyv1.EncapAlways
	case "VXLANCrossSubnet":
		spec.VXLANMode = tabbyv1.EncapCrossSubnet
	default:
		return nil, fmt.Errorf("encapsulation %q: use one of %v", encapsulation, Encapsulations)
	}
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolName}, Spec: *spec}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return spec, nil
}

// DefaultIPv6PoolSpec is the spec of the default IPv6 pool: cidr and block
// size (0: the default), routed natively, without NAT outgoing, as
// Calico's default IPv6 pool (CALICO_IPV6POOL_NAT_OUTGOING is false:
// IPv6 pod addresses are usually routable).
func DefaultIPv6PoolSpec(cidr string, blockSize int) (*tabbyv1.IPPoolSpec, error) {
	if err := cidrOfFamily(cidr, false); err != nil {
		return nil, err
	}
	spec := &tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: DefaultIPv6PoolName}, Spec: *spec}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return spec, nil
}

// cidrOfFamily says what is wrong when cidr is a CIDR of the other family
// (a CIDR that does not parse is left to Validate).
func cidrOfFamily(cidr string, v4 bool) error {
	c, err := netip.ParsePrefix(cidr)
	if err != nil || c.Addr().Is4() == v4 {
		return nil
	}
	if v4 {
		return fmt.Errorf("cidr %s is an IPv6 CIDR: give it as --default-ipv6-pool-cidr", cidr)
	}
	return fmt.Errorf("cidr %s is an IPv4 CIDR: give it as --default-ipv4-pool-cidr", cidr)
}

// ensureDefaultPool creates the IPPool name with spec when the cluster
// has no IPPool of spec's family, as calico-node does with
// CALICO_IPV4POOL_CIDR and CALICO_IPV6POOL_CIDR: deploy/tabby.yaml then installs in one kubectl
// apply (a custom resource in the same apply as its CRD is refused, the
// CRD not being served yet), and a cluster whose pools someone made is
// left alone. Every tabbyd tries; the first create wins. It retries while
// the API server does not answer or its admission refuses the pool, until
// ctx ends. It reports whether the cluster has a pool of spec's family
// (false: ctx ended first).
func ensureDefaultPool(ctx context.Context, ds *datastore.Client, name string, spec tabbyv1.IPPoolSpec, log *slog.Logger) bool {
	backoff := 500 * time.Millisecond
	for {
		done, err := createDefaultPool(ctx, ds, name, spec, log)
		if done {
			return true
		}
		log.Warn("creating the default IPPool: will try again", "pool", name, "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// createDefaultPool makes one attempt; done says nothing is left to try.
func createDefaultPool(ctx context.Context, ds *datastore.Client, name string, spec tabbyv1.IPPoolSpec, log *slog.Logger) (done bool, err error) {
	pools, err := ds.IPPools.List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	v4 := cidrOfFamily(spec.CIDR, true) == nil
	same := 0
	for _, p := range pools.Items {
		if c, err := netip.ParsePrefix(p.Spec.CIDR); err == nil && c.Addr().Is4() == v4 {
			same++
		}
	}
	if same > 0 {
		log.Debug("the cluster has IPPools of this family: no default pool made", "pool", name, "pools", same)
		return true, nil
	}
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	_, err = ds.IPPools.Create(ctx, pool, metav1.CreateOptions{FieldManager: "tabbyd"})
	switch {
	case err == nil:
		log.Info("the cluster had no IPPool of this family: created the default one", "pool", name, "cidr", spec.CIDR, "blockSize", spec.BlockSize,
			"ipipMode", spec.IPIPMode, "vxlanMode", spec.VXLANMode, "natOutgoing", spec.NATOutgoing)
		return true, nil
	case apierrors.IsAlreadyExists(err):
		return true, nil
	case apierrors.IsInvalid(err):
		// Refused by admission. Either a pool was made a moment ago
		// (the overlap policy), which the next List sees, or the API
		// server's ValidatingAdmissionPolicies are not ready yet: right
		// after the CRDs and policies are applied, or after a restart,
		// a policy whose paramKind it has not discovered refuses every
		// write as Invalid ("failed to find resource referenced by
		// paramKind") for a few seconds. The spec passed Validate, so
		// try again.
		return false, fmt.Errorf("refused by the API server (an admission policy that is not ready yet, or a pool made meanwhile): %w", err)
	}
	return false, err
}
