package lab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// demoPlacement says how the demo's pods were placed: kube-scheduler runs
// with tabby's configuration, in which the extender alone decides node
// affinity (the pods' nodeSelectors), taints, pod (anti-)affinity and
// topology spread. One more pod, near-<last pod>, asks for the node of the
// last web pod by required pod affinity; it must land there.
func demoPlacement(ctx context.Context, cs kubernetes.Interface, s *State, o DemoOptions, pods []*corev1.Pod) error {
	target := pods[len(pods)-1]
	name := "near-" + target.Name
	near := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault, Labels: demoLabels(name)},
		Spec: corev1.PodSpec{
			Affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{demoPodLabel: target.Name}},
					TopologyKey:   corev1.LabelHostname,
				}},
			}},
			Containers:                    []corev1.Container{{Name: "pause", Image: AgnhostImage, Args: []string{"pause"}}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
	if err := createOrLabel(ctx, cs, near); err != nil {
		return err
	}
	var placed *corev1.Pod
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	err := poll(wctx, 200*time.Millisecond, func() error {
		p, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(wctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName == "" {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled {
					return fmt.Errorf("pod %s is not placed: %s", name, c.Message)
				}
			}
			return fmt.Errorf("pod %s is not placed yet", name)
		}
		placed = p
		return nil
	})
	fmt.Fprintf(o.Out, "\nPlacement: kube-scheduler runs with %s, which hands node affinity, taints, pod (anti-)affinity and topology spread to %s (%s in %s); it also drops nodes whose tabbyd sends no heartbeat\n",
		SchedulerConfigFile, ExtenderName, s.ControlPlane.Extender, s.ControlPlane.NetNS)
	var misplaced []string
	for _, p := range pods {
		if want := p.Spec.NodeSelector[corev1.LabelHostname]; want != "" && p.Spec.NodeName != want {
			misplaced = append(misplaced, fmt.Sprintf("%s on %s (nodeSelector %s)", p.Name, p.Spec.NodeName, want))
		}
	}
	if len(misplaced) == 0 {
		fmt.Fprintf(o.Out, "  %s..%s: nodeSelector %s=<node> -> each on its node, as the table shows\n", pods[0].Name, target.Name, corev1.LabelHostname)
	} else {
		fmt.Fprintf(o.Out, "  MISPLACED: %s\n", strings.Join(misplaced, ", "))
	}
	if err != nil {
		fmt.Fprintf(o.Out, "  %s: required podAffinity to pod=%s (%s): NOT PLACED: %v\n", name, target.Name, corev1.LabelHostname, err)
		return fmt.Errorf("placing %s by pod affinity: %w", name, err)
	}
	verdict := "as the rule says"
	if placed.Spec.NodeName != target.Spec.NodeName {
		verdict = "WRONG: the rule says " + target.Spec.NodeName
		err = fmt.Errorf("pod %s has required pod affinity to %s on %s, but was placed on %s: see %s's log in %s",
			name, target.Name, target.Spec.NodeName, placed.Spec.NodeName, ExtenderName, s.ControlPlane.Dir)
	}
	fmt.Fprintf(o.Out, "  %s: required podAffinity to pod=%s (%s) -> %s, %s\n", name, target.Name, corev1.LabelHostname, placed.Spec.NodeName, verdict)
	if req, rerr := ExtenderRequests(ctx, s); rerr == nil {
		fmt.Fprintf(o.Out, "  %s has answered %d filter and %d prioritize requests so far\n", ExtenderName, req["filter"], req["prioritize"])
	}
	if len(misplaced) > 0 {
		err = errors.Join(err, fmt.Errorf("pods not on the node their nodeSelector names: %s: see %s's log in %s",
			strings.Join(misplaced, ", "), ExtenderName, s.ControlPlane.Dir))
	}
	return err
}

// demoPolicyName names the demo's NetworkPolicy: only from may reach to.
func demoPolicyName(from, to string) string { return to + "-only-from-" + from }

// demoNetworkPolicy lets pod from reach pod to on TCP DemoPort, and
// nothing else reach pod to.
func demoNetworkPolicy(from, to string) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(DemoPort)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: demoPolicyName(from, to), Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{demoAppLabel: demoApp}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{demoPodLabel: to}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{demoPodLabel: from}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}},
			}},
		},
	}
}

// Cells of the matrix under the policy.
const (
	cellOK   = "ok"   // TCP and ping answered
	cellTCP  = "tcp"  // TCP answered, ping dropped
	cellPing = "ping" // ping answered, TCP not
	cellDeny = "deny" // both dropped
)

func cellOf(pr DemoProbe) string {
	switch {
	case pr.TCP && pr.ICMP:
		return cellOK
	case pr.TCP:
		return cellTCP
	case pr.ICMP:
		return cellPing
	}
	return cellDeny
}

// policyWant is the cell the demo's policy (only x may reach y, on TCP)
// makes of the probe from -> to. A pod's traffic to itself never leaves
// it, so no policy applies to it.
func policyWant(x, y, from, to string) string {
	switch {
	case to != y || from == y:
		return cellOK
	case from == x:
		return cellTCP
	}
	return cellDeny
}

// waitMatrix probes the matrix until every cell is as want says or d has
// passed, and returns the last probes and the cells that differ.
func waitMatrix(ctx context.Context, pods []*corev1.Pod, nsPaths []string, want func(from, to string) string, d time.Duration) ([]DemoProbe, []string) {
	deadline := time.Now().Add(d)
	for {
		probes := demoMatrix(ctx, pods, nsPaths)
		var wrong []string
		for _, pr := range probes {
			if got, w := cellOf(pr), want(pr.From, pr.To); got != w {
				wrong = append(wrong, fmt.Sprintf("%s -> %s: %s, want %s (%s %s)", pr.From, pr.To, got, w, pr.TCPErr, pr.Error))
			}
		}
		if len(wrong) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return probes, wrong
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// demoPolicy applies a NetworkPolicy that lets only the first pod reach the
// last one (TCP DemoPort), prints the matrix under it (waiting until the
// nodes' tabbyd enforce it), deletes it and waits until every pair
// reaches each other again.
func demoPolicy(ctx context.Context, cs kubernetes.Interface, o DemoOptions, pods []*corev1.Pod, nsPaths []string) (err error) {
	if len(pods) < 3 {
		fmt.Fprintf(o.Out, "\n(no NetworkPolicy demonstration: it needs 3 pods or more)\n")
		return nil
	}
	x, y := pods[0], pods[len(pods)-1]
	np := demoNetworkPolicy(x.Name, y.Name)
	nps := cs.NetworkingV1().NetworkPolicies(np.Namespace)
	if _, err := nps.Create(ctx, np, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		// Left by an interrupted demo: make it the demo's again.
		old, gerr := nps.Get(ctx, np.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		old.Spec = np.Spec
		_, err = nps.Update(ctx, old, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("updating NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	deleted := false
	deletePolicy := func(ctx context.Context) error {
		deleted = true
		err := nps.Delete(ctx, np.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
		return nil
	}
	defer func() {
		if !deleted {
			if derr := deletePolicy(context.Background()); derr != nil && err == nil {
				err = derr
			}
		}
	}()

	fmt.Fprintf(o.Out, "\nNetworkPolicy %s/%s: only %s may reach %s, and only on TCP %d (enforced by %s's tabbyd)\n",
		np.Namespace, np.Name, x.Name, y.Name, DemoPort, y.Spec.NodeName)
	fmt.Fprintf(o.Out, "  podSelector: {%s: %s}  policyTypes: [Ingress]\n", demoPodLabel, y.Name)
	fmt.Fprintf(o.Out, "  ingress: [{from: [{podSelector: {%s: %s}}], ports: [{protocol: TCP, port: %d}]}]\n", demoPodLabel, x.Name, DemoPort)
	want := func(from, to string) string { return policyWant(x.Name, y.Name, from, to) }
	probes, wrong := waitMatrix(ctx, pods, nsPaths, want, 30*time.Second)
	fmt.Fprintf(o.Out, "Connectivity under the policy: ok = TCP and ping answered, tcp = TCP only (ping dropped), deny = both dropped by the policy; ! = not what the policy says\n")
	printMatrix(o.Out, pods, func(i, j int) string {
		pr := probes[i*len(pods)+j]
		c := cellOf(pr)
		if c != want(pr.From, pr.To) {
			c += "!"
		}
		return c
	})
	denied := 0
	for _, pr := range probes {
		if want(pr.From, pr.To) == cellDeny {
			denied++
		}
	}
	if len(wrong) > 0 {
		fmt.Fprintf(o.Out, "%d of %d pairs are not as the policy says:\n", len(wrong), len(probes))
		for _, w := range wrong {
			fmt.Fprintf(o.Out, "  %s\n", strings.TrimSpace(w))
		}
		return fmt.Errorf("NetworkPolicy %s/%s is not enforced as written (%d pairs differ): see the tabbyd log of %s",
			np.Namespace, np.Name, len(wrong), y.Spec.NodeName)
	}
	fmt.Fprintf(o.Out, "as the policy says: %d pairs denied, %s -> %s TCP only, every other pair open\n", denied, x.Name, y.Name)

	if err := deletePolicy(ctx); err != nil {
		return err
	}
	probes, wrong = waitMatrix(ctx, pods, nsPaths, func(string, string) string { return cellOK }, 30*time.Second)
	if len(wrong) > 0 {
		for _, w := range wrong {
			fmt.Fprintf(o.Out, "  %s\n", strings.TrimSpace(w))
		}
		return fmt.Errorf("after deleting NetworkPolicy %s/%s, %d pairs still do not reach each other", np.Namespace, np.Name, len(wrong))
	}
	fmt.Fprintf(o.Out, "NetworkPolicy %s/%s deleted: %d of %d pairs reach each other again; the lab is open, as before the demo\n",
		np.Namespace, np.Name, len(probes), len(probes))
	return nil
}
