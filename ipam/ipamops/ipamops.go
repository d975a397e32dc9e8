// Package ipamops carries out the CNI plugins' IPAM requests (the agentapi
// vocabulary) with the ipam package. tabbyd's CNI agent serves them on its
// socket with informer caches and warm connections; the plugins run the same
// code in their own process (plugin/direct) when tabbyd does not answer, so
// both give the same answers and the same error texts.
package ipamops

import (
	"context"
	"errors"
	"fmt"
	"net"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Ops carries out the requests.
type Ops struct {
	DS   *datastore.Client
	IPAM *ipam.IPAM
	// Pods reads pods and namespaces for their annotations; nil reads them
	// from the API server.
	Pods ipam.PodLookup
}

// Request turns an assign request into an IPAM request: for a pod, its
// annotations (or its namespace's) override pools and families.
func (o *Ops) Request(ctx context.Context, r agentapi.AssignRequest) (ipam.Request, error) {
	req := ipam.Request{
		HandleID:  r.HandleID,
		Node:      r.Node,
		Namespace: r.Namespace,
		Pod:       r.Pod,
		IPv4:      r.IPv4,
		IPv6:      r.IPv6,
		IPv4Pools: r.IPv4Pools,
		IPv6Pools: r.IPv6Pools,
		IPs:       r.IPs,
		Use:       tabbyv1.UseWorkload,
	}
	if r.Namespace == "" || r.Pod == "" {
		req.Namespace, req.Pod = "", ""
		return req, nil
	}
	var ann ipam.PodAnnotations
	var err error
	if o.Pods != nil {
		ann, err = ipam.PodRequestVia(ctx, o.DS, o.Pods, r.Namespace, r.Pod)
	} else {
		ann, err = ipam.PodRequest(ctx, o.DS, r.Namespace, r.Pod)
	}
	if err != nil {
		return req, fmt.Errorf("reading the IPAM annotations of pod %s/%s: %w", r.Namespace, r.Pod, err)
	}
	ann.Apply(&req)
	return req, nil
}

// Assign assigns the addresses of a request and records its handle.
func (o *Ops) Assign(ctx context.Context, r agentapi.AssignRequest) ([]agentapi.Address, error) {
	req, err := o.Request(ctx, r)
	if err != nil {
		return nil, err
	}
	as, err := o.IPAM.Assign(ctx, req)
	return Addresses(as), err
}

// Addresses converts what IPAM assigned.
func Addresses(as []ipam.Assigned) []agentapi.Address {
	out := make([]agentapi.Address, 0, len(as))
	for _, a := range as {
		x := agentapi.Address{IP: a.IP}
		if a.Pool != nil {
			x.Pool = a.Pool.Name
		}
		if a.Block != nil {
			x.Block = a.Block.String()
		}
		out = append(out, x)
	}
	return out
}

// ReleaseHandle frees what a handle holds (ipam.IPAM.ReleaseHandle).
func (o *Ops) ReleaseHandle(ctx context.Context, handleID, node string) error {
	return o.IPAM.ReleaseHandle(ctx, handleID, node)
}

// HandleIPs lists a handle's addresses, searching the node's blocks when
// the handle object is missing.
func (o *Ops) HandleIPs(ctx context.Context, handleID, node string) ([]net.IP, error) {
	return o.IPAM.HandleIPsOnNode(ctx, handleID, node)
}

// NodeHandles lists the handles holding addresses on the node.
func (o *Ops) NodeHandles(ctx context.Context, node string) ([]string, error) {
	return o.IPAM.NodeHandles(ctx, node)
}

// UsablePools lists the pools the node may use for workloads.
func (o *Ops) UsablePools(ctx context.Context, node string) ([]agentapi.Pool, error) {
	ps, err := o.IPAM.UsablePools(ctx, node)
	if err != nil {
		return nil, err
	}
	out := make([]agentapi.Pool, 0, len(ps))
	for _, p := range ps {
		out = append(out, agentapi.Pool{Name: p.Name, CIDR: p.Spec.CIDR, IPIPMode: string(p.Spec.IPIPMode), VXLANMode: string(p.Spec.VXLANMode), Disabled: p.Spec.Disabled})
	}
	return out, nil
}

// Ping fails when the API server does not answer.
func (o *Ops) Ping(ctx context.Context) error { return o.DS.Ping(ctx) }

// Classify turns an error of Ops into the agent's wire error: its text,
// and whether the API server was unreachable or the pools exhausted.
func Classify(err error) *agentapi.Error {
	if err == nil {
		return nil
	}
	var ae *agentapi.Error
	if errors.As(err, &ae) {
		return ae
	}
	return &agentapi.Error{
		Message:     err.Error(),
		Unreachable: datastore.IsUnreachable(err),
		Exhausted:   errors.Is(err, ipam.ErrExhausted),
	}
}
