package datastore

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Informers are the informers over whole resources that a process's
// components share: one watch and one cache of every IPAMBlock for
// routing, NetworkPolicy and the CNI agent, not one each. Each component
// adds its own event handlers (OnChange) and indexers. Every cache drops
// managed fields (StripManagedFields). Informers over part of a resource
// (one node's pods) stay the component's own.
//
// A component given none makes its own set (NewInformers over its client).
type Informers struct {
	ds *Client

	mu   sync.Mutex
	made map[string]cache.SharedIndexInformer
	// started holds every informer made, true once Run started it.
	started map[cache.SharedIndexInformer]bool
}

// NewInformers returns an empty set over ds; informers are made on first
// use.
func NewInformers(ds *Client) *Informers {
	return &Informers{ds: ds, made: map[string]cache.SharedIndexInformer{}, started: map[cache.SharedIndexInformer]bool{}}
}

// Nodes is the informer of every Node.
func (s *Informers) Nodes() cache.SharedIndexInformer {
	return shared(s, "nodes", &corev1.Node{}, s.ds.Nodes)
}

// Namespaces is the informer of every Namespace.
func (s *Informers) Namespaces() cache.SharedIndexInformer {
	return shared(s, "namespaces", &corev1.Namespace{}, s.ds.Namespaces)
}

// IPPools is the informer of every IPPool.
func (s *Informers) IPPools() cache.SharedIndexInformer {
	return shared(s, "ippools", &tabbyv1.IPPool{}, s.ds.IPPools)
}

// IPAMBlocks is the informer of every IPAMBlock.
func (s *Informers) IPAMBlocks() cache.SharedIndexInformer {
	return shared(s, "ipamblocks", &tabbyv1.IPAMBlock{}, s.ds.IPAMBlocks)
}

// shared returns the set's informer named key, over every object c lists,
// made the first time.
func shared[L runtime.Object](s *Informers, key string, example runtime.Object, c ListWatcher[L]) cache.SharedIndexInformer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inf, ok := s.made[key]; ok {
		return inf
	}
	inf := NewInformer(example, c, nil, nil)
	_ = inf.SetTransform(StripManagedFields)
	s.made[key] = inf
	s.started[inf] = false
	return inf
}

// Run runs each informer of infs that no earlier Run of the set started,
// until ctx ends: components call it with the informers they use, and an
// informer one of them shares starts once. Components sharing a set must
// therefore share ctx's lifetime (tabbyd's). Informers not from the set
// (a component's own) are started every time.
func (s *Informers) Run(ctx context.Context, infs ...cache.SharedIndexInformer) {
	for _, inf := range infs {
		if s.claim(inf) {
			go inf.RunWithContext(ctx)
		}
	}
}

// claim says whether the caller is the one to start inf.
func (s *Informers) claim(inf cache.SharedIndexInformer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	started, ours := s.started[inf]
	if !ours {
		return true
	}
	s.started[inf] = true
	return !started
}
