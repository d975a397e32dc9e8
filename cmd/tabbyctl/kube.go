package main

import (
	"fmt"
	"sort"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tabbynet/tabby/datastore"
)

// kubeFlags are kubectl's flags that say which API server to use, on the
// commands that use one (and only there): --kubeconfig and --context, as
// kubectl reads them, so that `kubectl tabby --context prod ipam show`
// means what it means to kubectl.
type kubeFlags struct {
	kubeconfig string
	context    string
}

// addKubeFlags adds --kubeconfig and --context to cmd and its subcommands.
func addKubeFlags(cmd *cobra.Command, k *kubeFlags) {
	fs := cmd.PersistentFlags()
	fs.StringVar(&k.kubeconfig, "kubeconfig", "",
		"kubeconfig of the API server (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster service account)")
	fs.StringVar(&k.context, "context", "", "the kubeconfig context to use (default: its current-context)")
	_ = cmd.RegisterFlagCompletionFunc("context", k.completeContexts)
}

// restConfig loads the client configuration the way kubectl does:
// --kubeconfig, else $KUBECONFIG, else ~/.kube/config, with --context
// selecting the context; in a pod with none of these, its service account.
func (k *kubeFlags) restConfig() (*rest.Config, error) {
	cfg, err := k.clientConfig().ClientConfig()
	switch {
	case clientcmd.IsEmptyConfig(err):
		return nil, fmt.Errorf("no kubeconfig given: pass --kubeconfig, set $KUBECONFIG, write ~/.kube/config, or run in a pod with a service account")
	case err != nil && k.kubeconfig != "":
		return nil, fmt.Errorf("loading kubeconfig %s: %w (check that the file exists and that --context names one of its contexts)", k.kubeconfig, err)
	case err != nil:
		return nil, fmt.Errorf("loading the kubeconfig: %w (pass --kubeconfig, or check $KUBECONFIG and --context)", err)
	}
	cfg.UserAgent = "tabbyctl"
	return cfg, nil
}

// client is restConfig and a datastore client on it.
func (k *kubeFlags) client() (*rest.Config, *datastore.Client, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, nil, err
	}
	ds, err := datastore.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return cfg, ds, nil
}

func (k *kubeFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: k.context})
}

// completeContexts offers the kubeconfig's contexts to --context.
func (k *kubeFlags) completeContexts(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	raw, err := k.clientConfig().RawConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for n := range raw.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, cobra.ShellCompDirectiveNoFileComp
}
