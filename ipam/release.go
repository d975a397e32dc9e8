package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// recordHandle adds what an Assign took to its IPAMHandle, creating it or
// updating it with compare-and-swap.
func (m *IPAM) recordHandle(ctx context.Context, handleID, node string, assigned []assignedRef) error {
	if len(assigned) == 0 {
		return nil
	}
	add := map[string]int{}
	for _, a := range assigned {
		add[a.Block.String()]++
	}
	h := &tabbyv1.IPAMHandle{
		ObjectMeta: metav1.ObjectMeta{
			Name:   HandleObjectName(handleID),
			Labels: map[string]string{tabbyv1.LabelNode: NodeLabelValue(node)},
		},
		Spec: tabbyv1.IPAMHandleSpec{HandleID: handleID, Block: add},
	}
	_, err := m.ds.IPAMHandles.Create(ctx, h, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return wrapDS(m.ds, fmt.Errorf("recording handle %s: %w", handleID, err))
	}
	for range maxRetries {
		cur, err := m.ds.IPAMHandles.Get(ctx, h.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			if _, err = m.ds.IPAMHandles.Create(ctx, h, metav1.CreateOptions{}); err == nil {
				return nil
			}
			continue
		}
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("reading handle %s: %w", handleID, err))
		}
		if cur.Spec.HandleID != handleID {
			return fmt.Errorf("handle object %s belongs to handle %q, not %q", cur.Name, cur.Spec.HandleID, handleID)
		}
		n := cur.DeepCopy()
		n.Spec.Deleted = false
		if n.Spec.Block == nil {
			n.Spec.Block = map[string]int{}
		}
		for k, v := range add {
			n.Spec.Block[k] += v
		}
		if _, err = m.ds.IPAMHandles.Update(ctx, n, metav1.UpdateOptions{}); err == nil {
			return nil
		} else if !apierrors.IsConflict(err) {
			return wrapDS(m.ds, fmt.Errorf("updating handle %s: %w", handleID, err))
		}
	}
	return fmt.Errorf("handle %s kept changing under %d attempts to update it; try again", handleID, maxRetries)
}

// ReleaseHandle frees every address a handle holds and deletes the handle.
// Releasing a handle that holds nothing succeeds, so CNI DEL can repeat it.
// When the handle object is missing (an ADD that died before recording it),
// the node's blocks are searched for the handle's addresses.
//
// The first look at the handle and its blocks goes to the Source; what
// IPAM then does with them are writes with preconditions, and "nothing
// there" is confirmed with the API server.
func (m *IPAM) ReleaseHandle(ctx context.Context, handleID, node string) error {
	name := HandleObjectName(handleID)
	for attempt := range maxRetries {
		var h *tabbyv1.IPAMHandle
		var err error
		if attempt == 0 {
			h, err = m.src.Handle(ctx, name)
		}
		if h == nil && err == nil {
			h, err = getHandle(ctx, m.ds, name)
		}
		if err == nil && h == nil {
			if node == "" {
				return nil
			}
			blocks, err := m.nodeBlocks(ctx, node, false)
			if err != nil {
				return wrapDS(m.ds, err)
			}
			for _, b := range blocks {
				if BlockHolds(b, handleID) {
					if err := m.releaseHandleInBlock(ctx, b.Name, handleID, b); err != nil {
						return err
					}
				}
			}
			return nil
		}
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("reading handle %s: %w", handleID, err))
		}
		cidrs := make([]string, 0, len(h.Spec.Block))
		for c := range h.Spec.Block {
			cidrs = append(cidrs, c)
		}
		sort.Strings(cidrs)
		for _, c := range cidrs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				continue
			}
			if err := m.releaseHandleInBlock(ctx, BlockName(p), handleID, nil); err != nil {
				return err
			}
		}
		err = m.deleteHandle(ctx, h)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			continue // the handle gained addresses meanwhile: release those too
		default:
			return wrapDS(m.ds, fmt.Errorf("deleting handle %s: %w", handleID, err))
		}
	}
	return fmt.Errorf("handle %s kept changing under %d attempts to release it; try again", handleID, maxRetries)
}

// deleteHandle deletes handle object h only as read: a handle that changed
// since (it gained or lost addresses) fails with a conflict.
func (m *IPAM) deleteHandle(ctx context.Context, h *tabbyv1.IPAMHandle) error {
	uid, rv := h.UID, h.ResourceVersion
	return m.ds.IPAMHandles.Delete(ctx, h.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
}

// BlockHolds says whether block b holds an address for handleID (a
// block keeps only the attributes its allocations use).
func BlockHolds(b *tabbyv1.IPAMBlock, handleID string) bool {
	for _, a := range b.Spec.Attributes {
		if a.HandleID == handleID {
			return true
		}
	}
	return false
}

// releaseHandleInBlock frees a handle's addresses in one block (CAS). The
// first try works on known (a consistent read) or else on the Source's
// copy; a copy that shows nothing to release is checked against the API
// server.
func (m *IPAM) releaseHandleInBlock(ctx context.Context, blockName, handleID string, known *tabbyv1.IPAMBlock) error {
	return m.releaseHandlesInBlock(ctx, blockName, []string{handleID}, known)
}

// releaseHandlesInBlock frees the addresses of every handle of handleIDs
// in one block, in one write (CAS). A copy that is not a consistent read
// and shows nothing of one of them is checked against the API server.
func (m *IPAM) releaseHandlesInBlock(ctx context.Context, blockName string, handleIDs []string, known *tabbyv1.IPAMBlock) error {
	what := "handle " + handleIDs[0]
	if len(handleIDs) > 1 {
		what = fmt.Sprintf("%d handles (%s, ...)", len(handleIDs), handleIDs[0])
	}
	for attempt := range maxRetries {
		b, confirmed := known, known != nil
		var err error
		if attempt == 0 && b == nil {
			b, err = m.src.Block(ctx, blockName)
		}
		if attempt > 0 || (b == nil && err == nil) {
			b, err = getBlock(ctx, m.ds, blockName)
			confirmed = true
			if err == nil && b != nil {
				m.observe(b)
			}
		}
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("reading block %s: %w", blockName, err))
		}
		if b == nil {
			return nil
		}
		if err := blockOK(b); err != nil {
			return err
		}
		n := b.DeepCopy()
		released, missing := 0, false
		for _, id := range handleIDs {
			r := releaseHandle(n, id)
			released += r
			missing = missing || r == 0
		}
		if missing && !confirmed {
			continue // the copy may predate an allocation: look again
		}
		if released == 0 {
			return nil
		}
		updated, err := m.ds.IPAMBlocks.Update(ctx, n, metav1.UpdateOptions{})
		switch {
		case err == nil:
			m.observe(updated)
			return nil
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return nil
		default:
			return wrapDS(m.ds, fmt.Errorf("releasing %s in block %s: %w", what, blockName, err))
		}
	}
	return fmt.Errorf("block %s kept changing under %d attempts to release %s; try again", blockName, maxRetries, what)
}

// ReleaseHandles is ReleaseHandle for handles of one node released at once
// (a burst of pods deleted on the node): what they hold in one block is
// freed in a single write of that block, a compare-and-swap like any
// other, and then their handle objects are deleted together, each with
// the preconditions ReleaseHandle uses. A handle whose object the Source
// does not have, whose blocks failed, or that changed meanwhile goes
// through ReleaseHandle alone afterwards. The errors are in the order of
// handleIDs.
func (m *IPAM) ReleaseHandles(ctx context.Context, handleIDs []string, node string) []error {
	errs := make([]error, len(handleIDs))
	alone := make([]bool, len(handleIDs))
	handles := make([]*tabbyv1.IPAMHandle, len(handleIDs))
	byBlock := map[string][]int{}
	var blocks []string
	for i, id := range handleIDs {
		h, err := m.src.Handle(ctx, HandleObjectName(id))
		if err != nil || h == nil || h.Spec.HandleID != id || len(handleIDs) == 1 {
			alone[i] = true
			continue
		}
		handles[i] = h
		for c := range h.Spec.Block {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				continue
			}
			name := BlockName(p)
			if _, ok := byBlock[name]; !ok {
				blocks = append(blocks, name)
			}
			byBlock[name] = append(byBlock[name], i)
		}
	}
	sort.Strings(blocks)
	for _, name := range blocks {
		ids := make([]string, 0, len(byBlock[name]))
		for _, i := range byBlock[name] {
			ids = append(ids, handleIDs[i])
		}
		if err := m.releaseHandlesInBlock(ctx, name, ids, nil); err != nil {
			for _, i := range byBlock[name] {
				alone[i] = true
			}
		}
	}
	var wg sync.WaitGroup
	for i, h := range handles {
		if h == nil || alone[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := m.deleteHandle(ctx, h)
			switch {
			case err == nil, apierrors.IsNotFound(err):
			default: // changed meanwhile (a conflict), or an error ReleaseHandle meets again
				alone[i] = true
			}
		}()
	}
	wg.Wait()
	for i, id := range handleIDs {
		if alone[i] {
			errs[i] = m.ReleaseHandle(ctx, id, node)
		}
	}
	return errs
}

// Release frees single addresses. An address is left unreleased (and
// returned) when it is not allocated, when ReleaseOptions names a handle that
// does not hold it, or when it names a sequence number other than the one the
// address was allocated with (it was freed and handed out again since).
func (m *IPAM) Release(ctx context.Context, opts []ReleaseOptions) ([]net.IP, error) {
	return m.releaseIPs(ctx, opts, true)
}

func (m *IPAM) releaseIPs(ctx context.Context, opts []ReleaseOptions, updateHandles bool) ([]net.IP, error) {
	list, err := m.listPools(ctx)
	if err != nil {
		return nil, err
	}
	pools := newPoolSet(list)
	var unreleased []net.IP
	byBlock := map[netip.Prefix][]ReleaseOptions{}
	var order []netip.Prefix
	for _, o := range opts {
		a, ok := netip.AddrFromSlice(o.IP)
		if !ok {
			unreleased = append(unreleased, o.IP)
			continue
		}
		a = a.Unmap()
		p := pools.containing(a)
		if p == nil {
			unreleased = append(unreleased, o.IP)
			continue
		}
		bp := p.blocks.blockFor(a)
		if _, seen := byBlock[bp]; !seen {
			order = append(order, bp)
		}
		byBlock[bp] = append(byBlock[bp], o)
	}
	handleDelta := map[string]map[string]int{} // handle -> block cidr -> released
	for _, bp := range order {
		rel, skipped, err := m.releaseInBlock(ctx, bp, byBlock[bp])
		if err != nil {
			return nil, err
		}
		unreleased = append(unreleased, skipped...)
		for h, n := range rel {
			if handleDelta[h] == nil {
				handleDelta[h] = map[string]int{}
			}
			handleDelta[h][bp.String()] += n
		}
	}
	if updateHandles {
		for h, d := range handleDelta {
			if err := m.shrinkHandle(ctx, h, d); err != nil {
				return unreleased, err
			}
		}
	}
	return unreleased, nil
}

// releaseInBlock frees the given addresses of one block (CAS), returning the
// count released per handle and the addresses refused.
func (m *IPAM) releaseInBlock(ctx context.Context, bp netip.Prefix, opts []ReleaseOptions) (map[string]int, []net.IP, error) {
	for range maxRetries {
		b, err := m.ds.IPAMBlocks.Get(ctx, BlockName(bp), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			var all []net.IP
			for _, o := range opts {
				all = append(all, o.IP)
			}
			return nil, all, nil
		}
		if err != nil {
			return nil, nil, wrapDS(m.ds, fmt.Errorf("reading block %s: %w", bp, err))
		}
		m.observe(b)
		if err := blockOK(b); err != nil {
			return nil, nil, err
		}
		n := b.DeepCopy()
		released := map[string]int{}
		var skipped []net.IP
		for _, o := range opts {
			a, _ := netip.AddrFromSlice(o.IP)
			ord, _ := ordinalOf(bp, a.Unmap())
			attr := attributeOf(n, ord)
			if attr == nil {
				skipped = append(skipped, o.IP)
				continue
			}
			if o.HandleID != "" && attr.HandleID != o.HandleID {
				skipped = append(skipped, o.IP)
				continue
			}
			if o.SequenceNumber != nil {
				if s, ok := sequenceOf(n, ord); !ok || s != *o.SequenceNumber {
					skipped = append(skipped, o.IP)
					continue
				}
			}
			released[attr.HandleID]++
			releaseOrdinal(n, ord)
		}
		if len(released) == 0 {
			return nil, skipped, nil
		}
		compactAttributes(n)
		updated, err := m.ds.IPAMBlocks.Update(ctx, n, metav1.UpdateOptions{})
		switch {
		case err == nil:
			m.observe(updated)
			return released, skipped, nil
		case apierrors.IsConflict(err):
			continue
		default:
			return nil, nil, wrapDS(m.ds, fmt.Errorf("releasing in block %s: %w", bp, err))
		}
	}
	return nil, nil, fmt.Errorf("block %s kept changing under %d attempts to release from it; try again", bp, maxRetries)
}

// shrinkHandle takes released addresses off a handle, deleting it when it
// holds nothing more.
func (m *IPAM) shrinkHandle(ctx context.Context, handleID string, delta map[string]int) error {
	name := HandleObjectName(handleID)
	for range maxRetries {
		h, err := m.ds.IPAMHandles.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("reading handle %s: %w", handleID, err))
		}
		n := h.DeepCopy()
		total := 0
		for c, v := range n.Spec.Block {
			n.Spec.Block[c] = v - delta[c]
			if n.Spec.Block[c] <= 0 {
				delete(n.Spec.Block, c)
			} else {
				total += n.Spec.Block[c]
			}
		}
		if total == 0 {
			err = m.deleteHandle(ctx, h)
		} else {
			_, err = m.ds.IPAMHandles.Update(ctx, n, metav1.UpdateOptions{})
		}
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			continue
		default:
			return wrapDS(m.ds, fmt.Errorf("updating handle %s: %w", handleID, err))
		}
	}
	return fmt.Errorf("handle %s kept changing under %d attempts to update it; try again", handleID, maxRetries)
}

// HandleIPs returns the addresses a handle holds (none when it holds nothing).
func (m *IPAM) HandleIPs(ctx context.Context, handleID string) ([]net.IP, error) {
	return m.HandleIPsOnNode(ctx, handleID, "")
}

// HandleIPsOnNode is HandleIPs that, when the handle object is missing (an
// assignment whose handle was not recorded yet, see AssignDeferred), finds
// the handle's addresses in the node's blocks.
func (m *IPAM) HandleIPsOnNode(ctx context.Context, handleID, node string) ([]net.IP, error) {
	h, err := m.ds.IPAMHandles.Get(ctx, HandleObjectName(handleID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if node == "" {
			return nil, nil
		}
		return m.handleIPsInNodeBlocks(ctx, handleID, node)
	}
	if err != nil {
		return nil, wrapDS(m.ds, fmt.Errorf("reading handle %s: %w", handleID, err))
	}
	var out []net.IP
	for c := range h.Spec.Block {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		b, err := m.ds.IPAMBlocks.Get(ctx, BlockName(p), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, wrapDS(m.ds, fmt.Errorf("reading block %s: %w", p, err))
		}
		for ord := range b.Spec.Allocations {
			if a := attributeOf(b, ord); a != nil && a.HandleID == handleID {
				out = append(out, net.IP(addrAt(p, ord).AsSlice()))
			}
		}
	}
	sortIPs(out)
	return out, nil
}

func (m *IPAM) handleIPsInNodeBlocks(ctx context.Context, handleID, node string) ([]net.IP, error) {
	blocks, err := m.nodeBlocks(ctx, node, false)
	if err != nil {
		return nil, wrapDS(m.ds, err)
	}
	var out []net.IP
	for _, b := range blocks {
		p, err := blockPrefix(b)
		if err != nil {
			continue
		}
		for ord := range b.Spec.Allocations {
			if a := attributeOf(b, ord); a != nil && a.HandleID == handleID {
				out = append(out, net.IP(addrAt(p, ord).AsSlice()))
			}
		}
	}
	sortIPs(out)
	return out, nil
}

func sortIPs(ips []net.IP) {
	sort.Slice(ips, func(i, j int) bool { return ips[i].String() < ips[j].String() })
}

// NodeHandles returns the IDs of handles holding addresses allocated on a
// node: those recorded for it, and any found in its blocks.
func (m *IPAM) NodeHandles(ctx context.Context, node string) ([]string, error) {
	l, err := m.ds.IPAMHandles.List(ctx, metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=" + NodeLabelValue(node)})
	if err != nil {
		return nil, wrapDS(m.ds, fmt.Errorf("listing the handles of node %s: %w", node, err))
	}
	seen := map[string]bool{}
	for _, h := range l.Items {
		seen[h.Spec.HandleID] = true
	}
	blocks, err := m.nodeBlocks(ctx, node, false)
	if err != nil {
		return nil, wrapDS(m.ds, err)
	}
	for _, b := range blocks {
		for ord := range b.Spec.Allocations {
			if a := attributeOf(b, ord); a != nil && a.Node == node {
				seen[a.HandleID] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for h := range seen {
		out = append(out, h)
	}
	sort.Strings(out)
	return out, nil
}

// UsablePools returns the enabled, valid pools whose nodeSelector matches the
// node, for workloads.
func (m *IPAM) UsablePools(ctx context.Context, node string) ([]*tabbyv1.IPPool, error) {
	set, n, err := m.poolsFor(ctx, node)
	if err != nil {
		return nil, err
	}
	var out []*tabbyv1.IPPool
	for _, f := range []int{4, 6} {
		c, _, _ := set.candidates(f, nil, tabbyv1.UseWorkload, n, node)
		for _, p := range c {
			out = append(out, p.obj)
		}
	}
	return out, nil
}

// poolsFor reads the pools, and the node when a pool's nodeSelector needs
// it (nil: the node is not registered).
func (m *IPAM) poolsFor(ctx context.Context, node string) (*poolSet, *corev1.Node, error) {
	list, err := m.listPools(ctx)
	if err != nil {
		return nil, nil, err
	}
	var n *corev1.Node
	if needsNode(list) {
		if n, err = m.src.Node(ctx, node); err != nil {
			return nil, nil, wrapDS(m.ds, fmt.Errorf("reading node %s: %w", node, err))
		}
	}
	return newPoolSet(list), n, nil
}

// PodAnnotations are the IPAM choices a pod (or its namespace) makes.
type PodAnnotations struct {
	IPv4Pools, IPv6Pools []string
	IPs                  []net.IP
}

// Apply makes the annotations override what a request asks for: their pool
// lists replace the request's, and requested addresses replace the families
// (each address asks for its own family).
func (a PodAnnotations) Apply(req *Request) {
	if len(a.IPv4Pools) > 0 {
		req.IPv4Pools = a.IPv4Pools
	}
	if len(a.IPv6Pools) > 0 {
		req.IPv6Pools = a.IPv6Pools
	}
	if len(a.IPs) > 0 {
		req.IPs = a.IPs
		req.IPv4, req.IPv6 = false, false
		for _, ip := range a.IPs {
			if ip.To4() != nil {
				req.IPv4 = true
			} else {
				req.IPv6 = true
			}
		}
	}
}

// PodLookup reads a Pod and a Namespace; errors are the API server's (a
// missing object is a NotFound error). The default reads them from the API
// server; tabbyd reads its informer caches first.
type PodLookup interface {
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	Namespace(ctx context.Context, name string) (*corev1.Namespace, error)
}

type apiPods struct{ ds *datastore.Client }

func (l apiPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return l.ds.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (l apiPods) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	return l.ds.Namespaces.Get(ctx, name, metav1.GetOptions{})
}

// PodRequest reads a pod's IPAM annotations, falling back to its namespace's
// for the pool lists. The Pod and Namespace are read concurrently.
func PodRequest(ctx context.Context, ds *datastore.Client, namespace, pod string) (PodAnnotations, error) {
	return PodRequestVia(ctx, ds, apiPods{ds}, namespace, pod)
}

// PodRequestVia is PodRequest reading the Pod and Namespace through l (ds
// names the API server in errors).
func PodRequestVia(ctx context.Context, ds *datastore.Client, l PodLookup, namespace, pod string) (PodAnnotations, error) {
	var out PodAnnotations
	var p *corev1.Pod
	var ns *corev1.Namespace
	var perr, nerr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p, perr = l.Pod(ctx, namespace, pod) }()
	go func() { defer wg.Done(); ns, nerr = l.Namespace(ctx, namespace) }()
	wg.Wait()
	if perr != nil {
		if apierrors.IsNotFound(perr) {
			return out, fmt.Errorf("pod %s/%s does not exist in the API server at %s: is the CNI kubeconfig for this cluster?", namespace, pod, ds.Host())
		}
		return out, wrapDS(ds, fmt.Errorf("reading pod %s/%s: %w", namespace, pod, perr))
	}
	if nerr != nil && !apierrors.IsNotFound(nerr) {
		return out, wrapDS(ds, fmt.Errorf("reading namespace %s: %w", namespace, nerr))
	}
	if apierrors.IsNotFound(nerr) {
		ns = nil
	}
	get := func(key string) (string, string) {
		if v, ok := p.Annotations[key]; ok {
			return v, "pod " + namespace + "/" + pod
		}
		if ns != nil && key != tabbyv1.AnnotationIPAddrs {
			if v, ok := ns.Annotations[key]; ok {
				return v, "namespace " + namespace
			}
		}
		return "", ""
	}
	var err error
	if v, src := get(tabbyv1.AnnotationIPv4Pools); src != "" {
		if out.IPv4Pools, err = parseList(v, src, tabbyv1.AnnotationIPv4Pools); err != nil {
			return out, err
		}
	}
	if v, src := get(tabbyv1.AnnotationIPv6Pools); src != "" {
		if out.IPv6Pools, err = parseList(v, src, tabbyv1.AnnotationIPv6Pools); err != nil {
			return out, err
		}
	}
	if v, src := get(tabbyv1.AnnotationIPAddrs); src != "" {
		addrs, err := parseList(v, src, tabbyv1.AnnotationIPAddrs)
		if err != nil {
			return out, err
		}
		for _, s := range addrs {
			ip := net.ParseIP(s)
			if ip == nil {
				return out, fmt.Errorf("%s: annotation %s holds %q, which is not an IP address", src, tabbyv1.AnnotationIPAddrs, s)
			}
			out.IPs = append(out.IPs, ip)
		}
	}
	return out, nil
}

func parseList(v, src, key string) ([]string, error) {
	var l []string
	if err := json.Unmarshal([]byte(v), &l); err != nil {
		return nil, fmt.Errorf("%s: annotation %s must be a JSON list of strings such as [\"default-ipv4\"], got %q: %w", src, key, v, err)
	}
	if len(l) == 0 {
		return nil, errors.New(src + ": annotation " + key + " is an empty list: remove it or name at least one")
	}
	return l, nil
}
