// Package cnitoken gives the CNI plugin a short-lived credential: a token of
// the tabby-cni service account minted with the TokenRequest API, written
// into the plugin's kubeconfig on the host and minted again well before it
// expires, as calico-node does for Calico's CNI plugin.
//
// The plugin runs on the host, outside any pod, so kubelet renews nothing
// for it. install-cni mints the first token when the tabby-node pod starts
// (before the conflist exists, so the plugin never runs without one);
// tabbyd's Refresher then mints a new one each time a quarter of the
// token's lifetime has passed. With the default lifetime of 24 hours (as
// Calico's), the plugin keeps its direct path to the API server for at
// least 18 hours while tabbyd is down; a shorter lifetime shortens what a
// token stolen from a host is worth and that grace alike.
package cnitoken

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tabbynet/tabby/contract"
)

const (
	// DefaultNamespace and DefaultServiceAccount name the CNI plugin's
	// service account.
	DefaultNamespace      = contract.DefaultNamespace
	DefaultServiceAccount = "tabby-cni"
	// DefaultLifetime is the lifetime asked of the API server (it may
	// grant less: --service-account-max-token-expiration).
	DefaultLifetime = 24 * time.Hour
	// MinLifetime is the shortest the TokenRequest API grants.
	MinLifetime = 10 * time.Minute
	// RefreshFraction: a token is replaced once 1/RefreshFraction of its
	// lifetime has passed, so that 3/4 of it is left for the plugin should
	// tabbyd stop.
	RefreshFraction = 4
	// Retries after a failed mint back off from RetryMin to RetryMax.
	RetryMin = 5 * time.Second
	RetryMax = 5 * time.Minute
	// FileMode is the mode of the kubeconfig: it holds a credential, so
	// only root (the container runtime running the plugin) reads it.
	FileMode fs.FileMode = 0o600
)

// Token is one minted token and when it is valid.
type Token struct {
	Value           string
	Issued, Expires time.Time
}

// Minter mints tokens of one service account.
type Minter struct {
	// Client is a REST client of the core API group (/api/v1: client-go's
	// CoreV1().RESTClient(), or the datastore's CoreREST()) as someone
	// allowed to create serviceaccounts/token of the account (tabby-node).
	Client                    rest.Interface
	Namespace, ServiceAccount string
	// Lifetime asked for (default DefaultLifetime, at least MinLifetime).
	Lifetime time.Duration
}

// Mint asks the API server for a new token. Its audience is the API
// server's own (none given), and it is bound to no object: it stays valid
// until it expires, whatever happens to the pod that minted it.
func (m Minter) Mint(ctx context.Context) (Token, error) {
	lifetime := m.Lifetime
	if lifetime == 0 {
		lifetime = DefaultLifetime
	}
	if lifetime < MinLifetime {
		return Token{}, fmt.Errorf("CNI token lifetime %v is below the API server's minimum of %v", lifetime, MinLifetime)
	}
	secs := int64(lifetime / time.Second)
	issued := time.Now()
	// The call client-go's typed CreateToken makes, without its clientset.
	// The request says what it is: the datastore's scheme does not know
	// TokenRequests.
	req := &authenticationv1.TokenRequest{
		TypeMeta: metav1.TypeMeta{APIVersion: authenticationv1.SchemeGroupVersion.String(), Kind: "TokenRequest"},
		Spec:     authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}
	tr := &authenticationv1.TokenRequest{}
	err := m.Client.Post().Namespace(m.Namespace).Resource("serviceaccounts").Name(m.ServiceAccount).SubResource("token").
		Body(req).Do(ctx).Into(tr)
	if err != nil {
		return Token{}, fmt.Errorf("minting a token of the service account %s/%s (TokenRequest): %w (the caller needs create on serviceaccounts/token of %s: the tabby-node Role)",
			m.Namespace, m.ServiceAccount, err, m.ServiceAccount)
	}
	if tr.Status.Token == "" {
		return Token{}, fmt.Errorf("the API server returned an empty token for %s/%s", m.Namespace, m.ServiceAccount)
	}
	return Token{Value: tr.Status.Token, Issued: issued, Expires: tr.Status.ExpirationTimestamp.Time}, nil
}

// NextRefresh is when t should be replaced: once 1/RefreshFraction of its
// lifetime (as granted) has passed.
func NextRefresh(t Token) time.Time {
	return t.Issued.Add(t.Expires.Sub(t.Issued) / RefreshFraction)
}

// RetryAfter is how long to wait after failures failed mints in a row:
// doubling from RetryMin up to RetryMax.
func RetryAfter(failures int) time.Duration {
	d := RetryMin
	for i := 1; i < failures && d < RetryMax; i++ {
		d *= 2
	}
	return min(d, RetryMax)
}

// header starts every kubeconfig written here.
const header = "# Written by tabby (install-cni, then tabbyd) for the tabby CNI plugin: a\n" +
	"# short-lived token of the service account tabby-system/tabby-cni, minted\n" +
	"# with TokenRequest and replaced by tabbyd long before it expires.\n"

// Kubeconfig renders the plugin's kubeconfig: the API server at server
// (an https URL) with the CA bundle ca, and token.
func Kubeconfig(server string, ca []byte, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["tabby-cni"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["tabby-cni"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: "tabby-cni"}
	cfg.CurrentContext = "tabby-cni"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	return append([]byte(header), data...), nil
}

// ServerOf reads the API server and CA bundle of a kubeconfig Kubeconfig
// wrote (its current context's cluster).
func ServerOf(path string) (server string, ca []byte, err error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("reading the CNI kubeconfig %s: %w (install-cni writes it when the tabby-node pod starts)", path, err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.Clusters[ctx.Cluster] == nil {
		return "", nil, fmt.Errorf("the CNI kubeconfig %s has no current context with a cluster: restart the tabby-node pod so install-cni writes it again", path)
	}
	c := cfg.Clusters[ctx.Cluster]
	if c.Server == "" || len(c.CertificateAuthorityData) == 0 {
		return "", nil, fmt.Errorf("the CNI kubeconfig %s names no server or CA data: restart the tabby-node pod so install-cni writes it again", path)
	}
	if b, _ := pem.Decode(c.CertificateAuthorityData); b == nil {
		return "", nil, fmt.Errorf("the CA data of the CNI kubeconfig %s is not PEM", path)
	} else if _, err := x509.ParseCertificate(b.Bytes); err != nil {
		return "", nil, fmt.Errorf("the CA data of the CNI kubeconfig %s: %w", path, err)
	}
	return c.Server, c.CertificateAuthorityData, nil
}

// WriteFile replaces path with data atomically (a temporary file in the
// same folder, synced, renamed over it), mode FileMode: the plugin reads
// the old kubeconfig or the new one, never a part.
func WriteFile(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".tabby-token-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("writing into %s: %w (is the host's CNI config dir mounted read-write?)", dir, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(FileMode); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return nil
}

// Refresher keeps the kubeconfig at Path carrying a valid token.
type Refresher struct {
	Minter
	// Path is the kubeconfig install-cni wrote; its server and CA are kept.
	Path string
	Log  *slog.Logger
	// Refreshed, when set, is called with each token written (metrics,
	// tests).
	Refreshed func(Token)
	// after waits (nil: time.After); tests make it return at once.
	after func(time.Duration) <-chan time.Time
}

// Refresh mints a token and writes it into the kubeconfig once.
func (r *Refresher) Refresh(ctx context.Context) (Token, error) {
	server, ca, err := ServerOf(r.Path)
	if err != nil {
		return Token{}, err
	}
	t, err := r.Mint(ctx)
	if err != nil {
		return Token{}, err
	}
	data, err := Kubeconfig(server, ca, t.Value)
	if err != nil {
		return Token{}, err
	}
	if err := WriteFile(r.Path, data); err != nil {
		return Token{}, err
	}
	if r.Refreshed != nil {
		r.Refreshed(t)
	}
	return t, nil
}

// Run refreshes at once, then each time NextRefresh comes, until ctx ends.
// A failed refresh is retried with backoff, and logged as an error once
// the token written last has expired (the plugin then fails when tabbyd's
// agent is not there to answer it).
func (r *Refresher) Run(ctx context.Context) {
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var last Token
	failures := 0
	for {
		wait := time.Duration(0)
		t, err := r.Refresh(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			wait = RetryAfter(failures)
			level := slog.LevelWarn
			if !last.Expires.IsZero() && time.Now().After(last.Expires) {
				level = slog.LevelError
			}
			log.Log(ctx, level, "refreshing the CNI plugin's token failed; retrying", "kubeconfig", r.Path,
				"expires", last.Expires, "retry-in", wait, "err", err)
		default:
			failures, last = 0, t
			wait = time.Until(NextRefresh(t))
			log.Info("wrote a new CNI plugin token", "kubeconfig", r.Path, "expires", t.Expires.UTC().Format(time.RFC3339), "next-refresh-in", wait.Round(time.Second))
		}
		after := r.after
		if after == nil {
			after = time.After
		}
		select {
		case <-ctx.Done():
			return
		case <-after(wait):
		}
	}
}
