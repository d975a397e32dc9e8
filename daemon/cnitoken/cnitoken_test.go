package cnitoken

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

// TestNextRefresh: the pure schedule. A token is replaced once a quarter of
// its granted lifetime has passed, whatever was asked.
func TestNextRefresh(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		lifetime, want time.Duration
	}{
		{24 * time.Hour, 6 * time.Hour},
		{time.Hour, 15 * time.Minute}, // an API server capping at 1 h
		{10 * time.Minute, 150 * time.Second},
	} {
		got := NextRefresh(Token{Issued: t0, Expires: t0.Add(c.lifetime)})
		if got.Sub(t0) != c.want {
			t.Errorf("lifetime %v: refresh after %v, want %v", c.lifetime, got.Sub(t0), c.want)
		}
		// What the plugin has left should tabbyd stop right after.
		if left := c.lifetime - c.want; left < c.lifetime*3/4 {
			t.Errorf("lifetime %v: only %v left at the refresh", c.lifetime, left)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for failures, want := range map[int]time.Duration{1: 5 * time.Second, 2: 10 * time.Second, 4: 40 * time.Second, 7: RetryMax, 50: RetryMax} {
		if got := RetryAfter(failures); got != want {
			t.Errorf("after %d failures: %v, want %v", failures, got, want)
		}
	}
}

// setup makes the CNI plugin's service account and a kubeconfig file as
// install-cni leaves it (with a placeholder token).
func setup(t *testing.T) (*kubernetes.Clientset, string) {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: DefaultServiceAccount, Namespace: DefaultNamespace}}
	if _, err := cs.CoreV1().ServiceAccounts(DefaultNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tabby-kubeconfig")
	data, err := Kubeconfig(clustertest.Cluster(t).Server, clustertest.Cluster(t).CAData(), "placeholder")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return cs, path
}

// works checks the kubeconfig at path: mode 0600, and the API server takes
// its token as the CNI plugin's service account (a real call). It returns
// the token.
func works(t *testing.T, path string) string {
	t.Helper()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != FileMode {
		t.Fatalf("%s: %v, mode %v, want %v", path, err, st.Mode().Perm(), FileMode)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a call with the written kubeconfig: %v", err)
	}
	if want := "system:serviceaccount:" + DefaultNamespace + ":" + DefaultServiceAccount; r.Status.UserInfo.Username != want {
		t.Fatalf("the written kubeconfig is %q, want %s", r.Status.UserInfo.Username, want)
	}
	// And a list call, as the plugin's IPAM makes (RBAC is deploy's test:
	// here the account has no role, so the answer is Forbidden, not
	// Unauthorized).
	_, err = cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{Limit: 1})
	if err != nil && !apierrors.IsForbidden(err) {
		t.Fatalf("a list call with the written kubeconfig: %v", err)
	}
	return rc.BearerToken
}

// TestRefresherRewritesBeforeExpiry runs the refresher against the real API
// server with the shortest lifetime it grants (10 minutes); only its waits
// are cut short, and recorded.
func TestRefresherRewritesBeforeExpiry(t *testing.T) {
	cs, path := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var tokens []Token
	var waits []time.Duration
	written := make(chan string, 4)
	r := &Refresher{
		Minter: Minter{Client: cs.CoreV1().RESTClient(), Namespace: DefaultNamespace, ServiceAccount: DefaultServiceAccount, Lifetime: MinLifetime},
		Path:   path,
		Refreshed: func(tk Token) {
			tokens = append(tokens, tk)
		},
	}
	fire := make(chan time.Time)
	r.after = func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		written <- works(t, path)
		return fire
	}
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	first := <-written
	fire <- time.Now() // the refresh is due
	second := <-written
	cancel()
	<-done

	if first == "placeholder" || second == first {
		t.Fatalf("the kubeconfig was not rewritten with a new token")
	}
	if len(tokens) != 2 {
		t.Fatalf("%d tokens minted, want 2", len(tokens))
	}
	for i, tk := range tokens {
		if got := tk.Expires.Sub(tk.Issued); got < MinLifetime-time.Second || got > MinLifetime+time.Second {
			t.Errorf("token %d lives %v, want %v", i, got, MinLifetime)
		}
		// The next refresh comes a quarter into the token's life, long
		// before it expires: 3/4 of it is left (the API server states
		// the expiry to the second).
		if left := tk.Expires.Sub(tk.Issued.Add(waits[i])); waits[i] <= 0 || waits[i] > MinLifetime/RefreshFraction || left < MinLifetime*3/4-time.Second {
			t.Errorf("after token %d the refresher waits %v (expiry in %v)", i, waits[i], tk.Expires.Sub(tk.Issued))
		}
	}
	t.Logf("tokens live %v; refreshed after %v", tokens[0].Expires.Sub(tokens[0].Issued), waits[0].Round(time.Second))
}

// TestRefreshFailsClearly: what goes wrong says what to do.
func TestRefreshFailsClearly(t *testing.T) {
	cs, path := setup(t)
	r := &Refresher{Minter: Minter{Client: cs.CoreV1().RESTClient(), Namespace: DefaultNamespace, ServiceAccount: "no-such-account"}, Path: path}
	if _, err := r.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), "no-such-account") {
		t.Errorf("minting for a missing account: %v", err)
	}
	r = &Refresher{Minter: Minter{Client: cs.CoreV1().RESTClient(), Namespace: DefaultNamespace, ServiceAccount: DefaultServiceAccount, Lifetime: time.Minute}, Path: path}
	if _, err := r.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), "minimum") {
		t.Errorf("a one-minute lifetime: %v", err)
	}
	r = &Refresher{Minter: Minter{Client: cs.CoreV1().RESTClient(), Namespace: DefaultNamespace, ServiceAccount: DefaultServiceAccount}, Path: path + ".missing"}
	if _, err := r.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), "install-cni writes it") {
		t.Errorf("no kubeconfig: %v", err)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "placeholder") {
		t.Errorf("a failed refresh changed the kubeconfig")
	}
}
