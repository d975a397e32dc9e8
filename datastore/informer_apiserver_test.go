package datastore_test

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

func TestMain(m *testing.M) {
	clustertest.Main(m, func(c *controlplane.Cluster) error { return c.InstallCRDs(context.Background()) })
}

// TestInformerAfterOutage: an informer made by NewInformer sees a change
// made right after the API server comes back from an outage of 25 s,
// within seconds. client-go's reflector alone backs off to 30 s and more
// by then, and missed such changes for up to a minute. The bound is 20 s:
// the informer took 4.5-5.1 s on a quiet machine, and over 10 s once
// under a full CI run's load.
func TestInformerAfterOutage(t *testing.T) {
	c := clustertest.Cluster(t)
	ds, err := datastore.New(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := datastore.NewInformer(&tabbyv1.IPPool{}, ds.IPPools, nil, nil)
	go inf.Run(ctx.Done())
	for !inf.HasSynced() {
		time.Sleep(10 * time.Millisecond)
	}

	c.StopAPIServer()
	t.Cleanup(func() {
		if !c.APIServerRunning() {
			_ = c.StartAPIServer(context.Background())
		}
	})
	time.Sleep(25 * time.Second)
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "after-outage"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.99.0.0/16"}}
	// A restarted API server's admission (tabby's ValidatingAdmissionPolicy
	// on IPPools, whose paramKind is the IPPool CRD) may refuse writes for a
	// moment until it has rediscovered the CRD: that is the API server's,
	// not the informer's, so the create is retried and the informer's time
	// counts from when it succeeded.
	for {
		_, err := ds.IPPools.Create(ctx, pool, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			break
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("creating a pool after the API server came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	created := time.Now()
	t.Cleanup(func() { _ = ds.IPPools.Delete(context.Background(), pool.Name, metav1.DeleteOptions{}) })
	deadline := created.Add(20 * time.Second)
	for {
		if _, ok, _ := inf.GetStore().GetByKey(pool.Name); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the informer did not see a pool created right after the API server came back within %v of its creation", deadline.Sub(created))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the informer saw the new pool %v after the API server was back, %v after it was created (retry interval %v)",
		time.Since(back).Round(time.Millisecond), time.Since(created).Round(time.Millisecond), datastore.RetryUnreachable)
}
