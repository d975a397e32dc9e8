package lab

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/daemon/nodestatus"
)

// Report is what `lab status` shows.
type Report struct {
	Name    string    `json:"name"`
	Dir     string    `json:"dir"`
	Created time.Time `json:"created"`
	// Ready says lab up finished.
	Ready        bool         `json:"ready"`
	Server       string       `json:"server"`
	Kubeconfig   string       `json:"kubeconfig"`
	Forward      ProcReport   `json:"forward"`
	ControlPlane []ProcReport `json:"controlPlane"`
	// Extender is the scheduler extender kube-scheduler asks (nil when
	// the lab records none).
	Extender *ExtenderReport `json:"extender,omitempty"`
	Nodes    []NodeReport    `json:"nodes"`
	Pods     []PodReport     `json:"pods"`
	// APIError says why the API server could not be asked ("" when it
	// answered).
	APIError string `json:"apiError,omitempty"`
}

// ExtenderReport is tabby-scheduler-extender, asked from inside the
// control plane's namespace.
type ExtenderReport struct {
	URL string `json:"url"`
	// Healthz is "ok" or why /healthz failed.
	Healthz string `json:"healthz"`
	// Requests are the requests it answered with 200 by verb (filter,
	// prioritize), from its /metrics.
	Requests map[string]int `json:"requests,omitempty"`
}

// ProcReport is one process of the lab.
type ProcReport struct {
	Name    string `json:"name"`
	Pid     int    `json:"pid"`
	Running bool   `json:"running"`
}

// NodeReport is one node of the lab.
type NodeReport struct {
	Name       string     `json:"name"`
	NetNS      string     `json:"netns"`
	Address    string     `json:"address"`
	Address6   string     `json:"address6,omitempty"`
	Subnet     int        `json:"subnet"`
	Runtime    string     `json:"runtime"`
	Containerd ProcReport `json:"containerd"`
	Kubelet    ProcReport `json:"kubelet"`
	// Tabbyd is the node's tabby-node pod ("" when there is none).
	Tabbyd string `json:"tabbyd"`
	// Ready is the Node's Ready condition ("" when unknown).
	Ready string `json:"ready"`
	// Readyz is "ok" or why tabbyd's /readyz failed, asked from inside
	// the node.
	Readyz string `json:"readyz"`
	Pods   int    `json:"pods"`
	// BGP is tabbyd's status (sessions, routes), asked from inside the
	// node; BGPError says why it could not be had.
	BGP      *nodestatus.Status `json:"bgp,omitempty"`
	BGPError string             `json:"bgpError,omitempty"`
}

// PodReport is one pod of the lab.
type PodReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node"`
	Phase     string `json:"phase"`
	Ready     bool   `json:"ready"`
	IP        string `json:"ip"`
}

func procReport(p Proc) ProcReport { return ProcReport{Name: p.Name, Pid: p.Pid, Running: p.Alive()} }

// Inspect gathers the lab's status: its processes, each node's Node
// readiness and tabbyd's /readyz (asked from inside the node), and the
// pods with their nodes and addresses.
func Inspect(ctx context.Context, s *State) *Report {
	r := &Report{Name: s.Name, Dir: s.Dir, Created: s.Created, Ready: s.Ready, Server: s.ControlPlane.Server,
		Kubeconfig: s.Kubeconfig, Forward: procReport(s.Forward.Proc)}
	for _, p := range s.ControlPlane.Procs {
		r.ControlPlane = append(r.ControlPlane, procReport(p))
	}
	r.Nodes = make([]NodeReport, len(s.Nodes))
	var wg sync.WaitGroup
	for i := range s.Nodes {
		n := &s.Nodes[i]
		r.Nodes[i] = NodeReport{Name: n.Name, NetNS: n.NetNS, Address: n.Address, Address6: n.Address6, Subnet: n.Subnet,
			Runtime: n.Runtime, Containerd: procReport(n.Containerd), Kubelet: procReport(n.Kubelet)}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if err := tabbydReadyz(rctx, n); err != nil {
				r.Nodes[i].Readyz = err.Error()
			} else {
				r.Nodes[i].Readyz = "ok"
			}
			if bs, err := NodeBGP(rctx, n); err != nil {
				r.Nodes[i].BGPError = err.Error()
			} else {
				r.Nodes[i].BGP = bs
			}
		})
	}
	if s.ControlPlane.Extender != "" {
		r.Extender = &ExtenderReport{URL: s.ControlPlane.Extender, Healthz: "ok"}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if err := ExtenderHealthz(rctx, s); err != nil {
				r.Extender.Healthz = err.Error()
				return
			}
			r.Extender.Requests, _ = ExtenderRequests(rctx, s)
		})
	}
	wg.Wait()
	if err := inspectAPI(ctx, s, r); err != nil {
		r.APIError = err.Error()
	}
	return r
}

func inspectAPI(ctx context.Context, s *State, r *Report) error {
	cfg, err := s.RESTConfig()
	if err != nil {
		return err
	}
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, node := range nodes.Items {
		for i := range r.Nodes {
			if r.Nodes[i].Name != node.Name {
				continue
			}
			r.Nodes[i].Ready = "True"
			if err := nodeReady(&node); err != nil {
				r.Nodes[i].Ready = err.Error()
			}
		}
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		pr := PodReport{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase),
			IP: p.Status.PodIP}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				pr.Ready = c.Status == corev1.ConditionTrue
			}
		}
		r.Pods = append(r.Pods, pr)
		for i := range r.Nodes {
			if r.Nodes[i].Name != p.Spec.NodeName {
				continue
			}
			r.Nodes[i].Pods++
			if p.Namespace == tabbyNamespace && p.Labels["app.kubernetes.io/name"] == "tabby-node" && p.DeletionTimestamp == nil {
				r.Nodes[i].Tabbyd = fmt.Sprintf("%s (%s)", p.Name, p.Status.Phase)
			}
		}
	}
	sort.Slice(r.Pods, func(i, j int) bool {
		a, b := r.Pods[i], r.Pods[j]
		return a.Node+"/"+a.Namespace+"/"+a.Name < b.Node+"/"+b.Namespace+"/"+b.Name
	})
	return nil
}

func running(p ProcReport) string {
	switch {
	case p.Pid == 0:
		return "-"
	case p.Running:
		return fmt.Sprintf("running (%d)", p.Pid)
	}
	return fmt.Sprintf("DEAD (%d)", p.Pid)
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) { r.Write(w, false) }

// Write is Print, with wide the columns Print leaves out: each node's
// subnet and runtime, /readyz in full, the peers' wide columns (see
// nodestatus.WritePeers).
func (r *Report) Write(w io.Writer, wide bool) {
	state := "up"
	if !r.Ready {
		state = "NOT READY (lab up did not finish)"
	}
	fmt.Fprintf(w, "lab %s: %s since %s, folder %s\n", r.Name, state, r.Created.Local().Format(time.DateTime), r.Dir)
	fmt.Fprintf(w, "API server %s; from the host: %s (forward %s)\n", r.Server, r.Kubeconfig, running(r.Forward))
	var cp []string
	for _, p := range r.ControlPlane {
		cp = append(cp, p.Name+" "+running(p))
	}
	fmt.Fprintf(w, "control plane: %s\n", strings.Join(cp, ", "))
	if e := r.Extender; e != nil {
		fmt.Fprintf(w, "scheduler extender: %s (kube-scheduler's urlPrefix), /healthz %s, %d filter and %d prioritize requests answered\n",
			e.URL, oneLine(e.Healthz), e.Requests["filter"], e.Requests["prioritize"])
	}
	if r.APIError != "" {
		fmt.Fprintf(w, "API server does not answer: %s\n", r.APIError)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "NODE\tNAMESPACE\tADDRESS")
	if wide {
		fmt.Fprint(tw, "\tSUBNET\tRUNTIME")
	}
	fmt.Fprintln(tw, "\tCONTAINERD\tKUBELET\tTABBY-NODE POD\tNODE READY\tTABBYD /READYZ\tPODS")
	for _, n := range r.Nodes {
		readyz := oneLine(n.Readyz)
		addr := n.Address
		if n.Address6 != "" {
			addr += "," + n.Address6
		}
		fmt.Fprintf(tw, "%s\t%s\t%s", n.Name, n.NetNS, addr)
		if wide {
			readyz = strings.Join(strings.Fields(n.Readyz), " ")
			fmt.Fprintf(tw, "\t%d\t%s", n.Subnet, orDefault(n.Runtime, "-"))
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t%d\n", running(n.Containerd), running(n.Kubelet),
			orDefault(n.Tabbyd, "-"), orDefault(n.Ready, "?"), readyz, n.Pods)
	}
	_ = tw.Flush()
	r.printBGP(w, wide)
	if len(r.Pods) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tPHASE\tREADY\tIP")
	for _, p := range r.Pods {
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%v\t%s\n", p.Namespace, p.Name, orDefault(p.Node, "-"), p.Phase, p.Ready, orDefault(p.IP, "-"))
	}
	_ = tw.Flush()
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// printBGP writes each node's BGP peers (tabbyd's /status).
func (r *Report) printBGP(w io.Writer, wide bool) {
	for _, n := range r.Nodes {
		fmt.Fprintln(w)
		if n.BGP == nil {
			fmt.Fprintf(w, "%s: BGP status unavailable: %s\n", n.Name, oneLine(n.BGPError))
			continue
		}
		rt := n.BGP.Routes
		fmt.Fprintf(w, "%s: AS %d, %d BGP peer(s), %d routes programmed, %d learned, %d advertised\n",
			n.Name, n.BGP.AS, len(n.BGP.Peers), rt.Programmed, rt.Learned, rt.Advertised)
		if len(n.BGP.Peers) > 0 {
			n.BGP.WritePeers(w, "  ", wide)
		}
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// tabbydReadyz asks node n's tabbyd for /readyz from inside the node.
func tabbydReadyz(ctx context.Context, n *Node) error {
	return httpOK(ctx, TabbydClient(n, 3*time.Second), TabbydURL("/readyz"))
}
