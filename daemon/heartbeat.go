package daemon

import (
	"context"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Heartbeat timing: tabbyd renews its Lease as soon as it is ready and then
// every HeartbeatInterval while it stays ready; readers take it as lapsed
// HeartbeatDuration after the last renewal (the scheduler extender then
// keeps new pods off the node).
const (
	HeartbeatInterval = 10 * time.Second
	HeartbeatDuration = 40 * time.Second
)

// HeartbeatLeaseName is the name of node's heartbeat Lease in tabbyd's
// namespace (tabby-scheduler-extender's network plugin reads it).
func HeartbeatLeaseName(node string) string { return "tabbyd-" + node }

// runHeartbeat renews the node's heartbeat Lease while ready says tabbyd is
// ready, until ctx ends.
func runHeartbeat(ctx context.Context, rc *rest.Config, namespace, node string, ready func() error, log *slog.Logger) {
	cs, err := coordclient.NewForConfig(rc)
	if err != nil {
		log.Error("heartbeat: no client; the scheduler extender will see this node's tabbyd as not running", "err", err)
		return
	}
	leases := cs.Leases(namespace)
	name := HeartbeatLeaseName(node)
	var lastErr string
	var renewed time.Time
	// Readiness is checked every second, so the first heartbeat goes out
	// the moment tabbyd is ready (the extender places no pod on the node
	// before it); after that the Lease is renewed every HeartbeatInterval.
	beat := func() {
		if err := ready(); err != nil {
			renewed = time.Time{} // not ready: let the Lease lapse
			return
		}
		if !renewed.IsZero() && time.Since(renewed) < HeartbeatInterval {
			return
		}
		err := renewLease(ctx, leases, name, node)
		if err != nil && err.Error() != lastErr {
			log.Warn("heartbeat: renewing the Lease failed; retrying", "lease", namespace+"/"+name, "err", err)
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
			return
		}
		renewed = time.Now()
	}
	beat()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			beat()
		}
	}
}

func renewLease(ctx context.Context, leases coordclient.LeaseInterface, name, node string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(HeartbeatDuration / time.Second)), RenewTime: &now}
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "tabbyd"}}, Spec: spec}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec = spec
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}
