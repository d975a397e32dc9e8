package inspect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Load reads a Snapshot from the API server. The pools are listed first;
// every other list is read at the pools' resourceVersion, so the snapshot
// is one consistent cut of the datastore (an ADD or DEL in flight is seen
// entirely before or after each of its writes). When the API server cannot
// serve that revision, the lists are read one after the other, blocks
// before pods, so that the pod an allocation was made for is listed.
func Load(ctx context.Context, ds *datastore.Client) (*Snapshot, error) {
	s := &Snapshot{}
	pools, err := ds.IPPools.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, listError(ds, "IPPools", err)
	}
	s.Pools = pools.Items
	s.Now = time.Now()
	rv := pools.ResourceVersion
	exact := metav1.ListOptions{ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchExact}
	if rv != "" {
		err := loadAt(ctx, ds, s, exact, true)
		if err == nil {
			s.Revision = rv
			return s, nil
		}
		var status apierrors.APIStatus
		if !errors.As(err, &status) {
			return nil, err
		}
		// Fall back: the revision is compacted, or kept elsewhere.
	}
	if err := loadAt(ctx, ds, s, metav1.ListOptions{}, false); err != nil {
		return nil, err
	}
	s.Now = time.Now()
	return s, nil
}

// loadAt lists everything but the pools with opts: concurrently when they
// are one cut, else in order.
func loadAt(ctx context.Context, ds *datastore.Client, s *Snapshot, opts metav1.ListOptions, concurrent bool) error {
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			l, err := ds.IPAMBlocks.List(ctx, opts)
			if err != nil {
				return listError(ds, "IPAMBlocks", err)
			}
			s.Blocks = l.Items
			return nil
		},
		func(ctx context.Context) error {
			l, err := ds.IPAMHandles.List(ctx, opts)
			if err != nil {
				return listError(ds, "IPAMHandles", err)
			}
			s.Handles = l.Items
			return nil
		},
		func(ctx context.Context) error {
			l, err := ds.BlockAffinities.List(ctx, opts)
			if err != nil {
				return listError(ds, "BlockAffinities", err)
			}
			s.Affinities = l.Items
			return nil
		},
		func(ctx context.Context) error {
			l, err := ds.Nodes.List(ctx, opts)
			if err != nil {
				return listError(ds, "Nodes", err)
			}
			s.Nodes = l.Items
			return nil
		},
		func(ctx context.Context) error {
			l, err := ds.Pods("").List(ctx, opts)
			if err != nil {
				return listError(ds, "Pods", err)
			}
			s.Pods = l.Items
			return nil
		},
	}
	if !concurrent {
		for _, step := range steps {
			if err := step(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, step := range steps {
		g.Go(func() error { return step(gctx) })
	}
	return g.Wait()
}

func listError(ds *datastore.Client, what string, err error) error {
	switch {
	case datastore.IsUnreachable(err):
		return datastore.Unreachable(ds.Host(), err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("listing %s: %w (tabbyctl ipam needs to list IPPools, IPAMBlocks, IPAMHandles, BlockAffinities, Nodes and Pods: use an admin kubeconfig)", what, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("listing %s: %w (are tabby's CRDs installed? kubectl apply --server-side -f deploy/crds/)", what, err)
	}
	return fmt.Errorf("listing %s: %w", what, err)
}

// Release frees the address a plan names through package ipam: a
// compare-and-swap on its block that names the handle and sequence number
// the plan saw, so an address released and handed out again meanwhile is
// left alone; IPAM takes the address off its IPAMHandle too, deleting the
// handle when it holds nothing more.
func Release(ctx context.Context, ds *datastore.Client, plan ReleasePlan) error {
	if !plan.Allocated {
		return nil
	}
	unreleased, err := ipam.New(ds).Release(ctx, []ipam.ReleaseOptions{{
		IP: net.IP(plan.IP.AsSlice()), HandleID: plan.Handle, SequenceNumber: plan.Sequence,
	}})
	if err != nil {
		if datastore.IsUnreachable(err) {
			return datastore.Unreachable(ds.Host(), err)
		}
		return fmt.Errorf("releasing %s: %w", plan.IP, err)
	}
	if len(unreleased) > 0 {
		return fmt.Errorf("%s was not released: it changed since it was read (freed, or handed out again); look again with tabbyctl ipam show --ip %s", plan.IP, plan.IP)
	}
	return nil
}
