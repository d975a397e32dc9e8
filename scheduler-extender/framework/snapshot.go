package framework

import (
	"sort"
	"unique"

	v1 "k8s.io/api/core/v1"
)

// Snapshot is the cluster state one decision reads. The extender's informer
// cache gives one per request; tests build one from slices (NewSnapshot).
// A Snapshot and everything it returns are read-only.
type Snapshot interface {
	// List is every node with its pods, sorted by name.
	List() []*NodeInfo
	// Get is a node by name, nil when unknown.
	Get(name string) *NodeInfo
	// Namespace is a namespace by name, nil when unknown.
	Namespace(name string) *v1.Namespace
}

// NodeInfo is a node and the pods bound to it that still hold it (not
// Succeeded or Failed).
type NodeInfo struct {
	Node *v1.Node
	Pods []*PodInfo
	// PodsWithAffinity have pod affinity or anti-affinity of any kind;
	// PodsWithRequiredAntiAffinity have required anti-affinity. Both are
	// subsets of Pods, kept so that checks against running pods do not
	// walk every pod.
	PodsWithAffinity             []*PodInfo
	PodsWithRequiredAntiAffinity []*PodInfo

	// labels is the labels of labelsOf, interned when the node entered the
	// cache (SetNode), so that each request's selector and topology-key
	// checks compare handles in a small slice rather than hashing strings
	// in every node's label map. Labels reads them only while labelsOf is
	// Node, so a NodeInfo whose Node was set without SetNode is still
	// answered right, only more slowly.
	labels   []Label
	labelsOf *v1.Node
}

// NewNodeInfo makes a NodeInfo of a node and its pods.
func NewNodeInfo(node *v1.Node, pods ...*PodInfo) *NodeInfo {
	ni := &NodeInfo{}
	ni.SetNode(node)
	for _, p := range pods {
		ni.AddPod(p)
	}
	return ni
}

// SetNode sets the node of a NodeInfo nobody reads yet, interning its
// labels.
func (ni *NodeInfo) SetNode(n *v1.Node) {
	ni.Node = n
	ni.labelsOf = n
	ni.labels = nil
	if n != nil {
		ni.labels = InternLabels(n.Labels)
	}
}

// SetNodeOf sets the node of a NodeInfo nobody reads yet to o's, with
// o's interned labels.
func (ni *NodeInfo) SetNodeOf(o *NodeInfo) {
	ni.Node, ni.labels, ni.labelsOf = o.Node, o.labels, o.labelsOf
}

// Labels is the node's labels, interned (read-only). Made by SetNode, they
// cost nothing here; a NodeInfo whose Node was set otherwise interns them
// on every call.
func (ni *NodeInfo) Labels() []Label {
	switch {
	case ni.labelsOf == ni.Node:
		return ni.labels
	case ni.Node == nil:
		return nil
	}
	return InternLabels(ni.Node.Labels)
}

// Label is the value of the node's label key, and whether it has it.
func (ni *NodeInfo) Label(key unique.Handle[string]) (unique.Handle[string], bool) {
	return LookupLabel(ni.Labels(), key)
}

// AddPod adds a pod to the node's lists. (Only for a NodeInfo nobody reads
// yet: snapshots are read-only.)
func (ni *NodeInfo) AddPod(p *PodInfo) {
	ni.Pods = append(ni.Pods, p)
	if p.HasAffinity() {
		ni.PodsWithAffinity = append(ni.PodsWithAffinity, p)
	}
	if p.HasRequiredAntiAffinity() {
		ni.PodsWithRequiredAntiAffinity = append(ni.PodsWithRequiredAntiAffinity, p)
	}
}

// Terminal says whether a pod no longer holds its node.
func Terminal(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// MapSnapshot is a Snapshot built once from slices.
type MapSnapshot struct {
	list       []*NodeInfo
	nodes      map[string]*NodeInfo
	namespaces map[string]*v1.Namespace
	labels     SharedLabelIndex
	// The nodes of list with pods with affinity, with required
	// anti-affinity.
	withAffinity, withRequiredAnti []*NodeInfo
}

var _ IndexedSnapshot = (*MapSnapshot)(nil)

// NewSnapshot builds a Snapshot: pods count on the node they are bound to
// (spec.nodeName); unbound and terminal pods are left out, as are pods of
// nodes not in nodes.
func NewSnapshot(nodes []*v1.Node, pods []*v1.Pod, namespaces []*v1.Namespace) *MapSnapshot {
	s := &MapSnapshot{nodes: map[string]*NodeInfo{}, namespaces: map[string]*v1.Namespace{}}
	for _, n := range nodes {
		ni := NewNodeInfo(n)
		s.nodes[n.Name] = ni
		s.list = append(s.list, ni)
	}
	sort.Slice(s.list, func(i, j int) bool { return s.list[i].Node.Name < s.list[j].Node.Name })
	var idx LabelIndex
	for _, p := range pods {
		if ni := s.nodes[p.Spec.NodeName]; ni != nil && !Terminal(p) {
			pi := NewPodInfo(p)
			ni.AddPod(pi)
			idx.Add(pi, ni.Node.Name, 1)
		}
	}
	s.labels = idx.Share()
	s.listAffinity()
	for _, ns := range namespaces {
		s.namespaces[ns.Name] = ns
	}
	return s
}

// listAffinity makes the lists of nodes with affinity pods.
func (s *MapSnapshot) listAffinity() {
	for _, ni := range s.list {
		if len(ni.PodsWithAffinity) > 0 {
			s.withAffinity = append(s.withAffinity, ni)
		}
		if len(ni.PodsWithRequiredAntiAffinity) > 0 {
			s.withRequiredAnti = append(s.withRequiredAnti, ni)
		}
	}
}

// SnapshotOf makes a Snapshot of NodeInfos by node name (those without a
// Node are left out), namespaces by name and the pods' labels (labels, an
// index of the same pods); order is the names of nodes, sorted. It keeps
// the maps: the caller must not change them afterwards.
func SnapshotOf(nodes map[string]*NodeInfo, namespaces map[string]*v1.Namespace, labels SharedLabelIndex, order []string) *MapSnapshot {
	s := &MapSnapshot{nodes: nodes, namespaces: namespaces, labels: labels, list: make([]*NodeInfo, 0, len(nodes))}
	for _, name := range order {
		if ni := nodes[name]; ni != nil && ni.Node != nil {
			s.list = append(s.list, ni)
		}
	}
	s.listAffinity()
	return s
}

// List implements Snapshot.
func (s *MapSnapshot) List() []*NodeInfo { return s.list }

// Get implements Snapshot.
func (s *MapSnapshot) Get(name string) *NodeInfo {
	if ni := s.nodes[name]; ni != nil && ni.Node != nil {
		return ni
	}
	return nil
}

// NodesWithLabel implements IndexedSnapshot.
func (s *MapSnapshot) NodesWithLabel(l Label) map[string]int32 { return s.labels.Nodes(l) }

// HavePodsWithAffinity implements IndexedSnapshot.
func (s *MapSnapshot) HavePodsWithAffinity() []*NodeInfo { return s.withAffinity }

// HavePodsWithRequiredAntiAffinity implements IndexedSnapshot.
func (s *MapSnapshot) HavePodsWithRequiredAntiAffinity() []*NodeInfo { return s.withRequiredAnti }

// Namespace implements Snapshot.
func (s *MapSnapshot) Namespace(name string) *v1.Namespace { return s.namespaces[name] }
