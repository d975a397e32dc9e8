package graph

import (
	"fmt"
	"sort"
	"strings"
)

// Colours of sessions by state, and of reflectors.
const (
	colourUp         = "#2e7d32"
	colourDown       = "#c62828"
	colourConfigured = "#757575"
	colourReflector  = "#fff2cc"
)

// Title says what the topology is: a full mesh, reflectors, or neither.
func (m Model) Title() string {
	var what string
	switch {
	case !m.Mesh:
		what = "node-to-node mesh off"
	case m.Reflectors:
		var rr []string
		for _, n := range m.Nodes {
			if n.Reflector {
				rr = append(rr, n.Name)
			}
		}
		what = "route reflectors " + strings.Join(rr, ", ")
	default:
		what = "full mesh"
	}
	return fmt.Sprintf("tabby BGP: %s, AS %d", what, m.AS)
}

// vertex is one end as drawn: its ID in the model and its label's lines.
type vertex struct {
	id    string
	lines []string
	kind  int // kindNode, kindReflector, kindExternal
}

const (
	kindNode = iota
	kindReflector
	kindExternal
)

// vertices are the nodes, the external speakers and any end a status
// names that neither lists (a node deleted since), in that order.
func (m Model) vertices() []vertex {
	var out []vertex
	seen := map[string]bool{}
	for _, n := range m.Nodes {
		v := vertex{id: n.Name, lines: nodeLines(n)}
		if n.Reflector {
			v.kind = kindReflector
		}
		out = append(out, v)
		seen[n.Name] = true
	}
	for _, e := range m.Externals {
		out = append(out, vertex{id: e.ID, lines: externalLines(e), kind: kindExternal})
		seen[e.ID] = true
	}
	var unknown []string
	for _, s := range m.Sessions {
		for _, end := range []string{s.A, s.B} {
			if !seen[end] {
				seen[end] = true
				unknown = append(unknown, end)
			}
		}
	}
	sort.Strings(unknown)
	for _, id := range unknown {
		out = append(out, vertex{id: id, lines: []string{id, "(not a Node)"}})
	}
	return out
}

func nodeLines(n Node) []string {
	name := n.Name
	if n.Reflector {
		name += " (route reflector " + n.ClusterID + ")"
	}
	lines := []string{name, strings.Join(append(append([]string(nil), n.Addresses...), fmt.Sprintf("AS %d", n.AS)), " · ")}
	if st := n.Status; st != nil {
		l := fmt.Sprintf("routes: %d learned, %d advertised", st.Learned, st.Advertised)
		if !st.Ready {
			l += " · NOT READY"
		}
		lines = append(lines, l)
	}
	return lines
}

func externalLines(e External) []string {
	addr := e.Address
	if e.Port != 0 && e.Port != 179 {
		addr = fmt.Sprintf("%s port %d", addr, e.Port)
	}
	var names []string
	for _, n := range e.BGPPeers {
		names = append(names, "bgppeer/"+n)
	}
	if len(names) == 0 {
		names = []string{"external peer"}
	}
	return []string{strings.Join(names, ", "), fmt.Sprintf("%s · AS %d", addr, e.AS)}
}

// edgeLines are a session's label: its state, its type where the line's
// form does not say it, the routes each live end accepted from the other.
func edgeLines(s Session) []string {
	first := s.State()
	if s.Type != "node-mesh" && s.Type != "route-reflector" {
		first += " · " + s.Type
	}
	if s.Family == 6 {
		first += " · IPv6"
	}
	lines := []string{first}
	var routes []string
	for _, e := range []struct {
		name string
		end  End
	}{{s.A, s.AEnd}, {s.B, s.BEnd}} {
		if !e.end.Live {
			continue
		}
		r := fmt.Sprintf("%s %d", e.name, e.end.Accepted)
		if e.end.Rejected > 0 {
			r += fmt.Sprintf(" (%d rejected)", e.end.Rejected)
		}
		routes = append(routes, r)
	}
	if len(routes) > 0 {
		lines = append(lines, "accepted: "+strings.Join(routes, ", "))
	}
	return lines
}

func edgeColour(s Session) string {
	switch s.State() {
	case "Established":
		return colourUp
	case StateConfigured:
		return colourConfigured
	}
	return colourDown
}

// DOT is the topology as a Graphviz digraph: `dot -Tsvg` draws it. Mesh
// sessions are plain lines, a reflector's sessions arrows to its clients;
// green is Established, red any other state, grey dashed configured only.
func DOT(m Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "digraph %s {\n", dotQuote("tabby-bgp"))
	fmt.Fprintf(&b, "\tlabel=%s;\n\tlabelloc=t;\n", dotQuote(m.Title()))
	b.WriteString("\tnode [shape=box, style=rounded, fontname=\"Helvetica\"];\n")
	b.WriteString("\tedge [fontname=\"Helvetica\", fontsize=10];\n")
	for _, v := range m.vertices() {
		attrs := ""
		switch v.kind {
		case kindReflector:
			attrs = fmt.Sprintf(", style=\"rounded,filled,bold\", fillcolor=%s", dotQuote(colourReflector))
		case kindExternal:
			attrs = ", shape=ellipse"
		}
		fmt.Fprintf(&b, "\t%s [label=%s%s];\n", dotQuote(v.id), dotLabel(v.lines), attrs)
	}
	for _, s := range m.Sessions {
		dir := "none"
		switch {
		case s.BothReflect:
			dir = "both"
		case s.Reflects:
			dir = "forward"
		}
		style := ""
		if s.State() == StateConfigured {
			style = ", style=dashed"
		}
		fmt.Fprintf(&b, "\t%s -> %s [dir=%s, label=%s, color=%s, fontcolor=%s%s];\n",
			dotQuote(s.A), dotQuote(s.B), dir, dotLabel(edgeLines(s)), dotQuote(edgeColour(s)), dotQuote(edgeColour(s)), style)
	}
	b.WriteString("}\n")
	return b.String()
}

// dotQuote is s as a DOT quoted string: backslashes and quotes escaped,
// line breaks as DOT's \n.
func dotQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\r\n", `\n`, "\n", `\n`, "\r", `\n`)
	return `"` + r.Replace(s) + `"`
}

// dotLabel is lines as one centred DOT label.
func dotLabel(lines []string) string {
	q := make([]string, len(lines))
	for i, l := range lines {
		q[i] = strings.TrimSuffix(strings.TrimPrefix(dotQuote(l), `"`), `"`)
	}
	return `"` + strings.Join(q, `\n`) + `"`
}

// Mermaid is the topology as a Mermaid flowchart, which GitHub renders in
// a ```mermaid block. The forms follow DOT's: mesh sessions are plain
// lines, a reflector's arrows to its clients; configured-only sessions
// are dotted; links are coloured by state.
func Mermaid(m Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\ntitle: %s\n---\n", mermaidTitle(m.Title()))
	b.WriteString("flowchart LR\n")
	ids := map[string]string{}
	for i, v := range m.vertices() {
		id := fmt.Sprintf("n%d", i)
		ids[v.id] = id
		open, closing := "[", "]"
		switch v.kind {
		case kindReflector:
			open, closing = "{{", "}}"
		case kindExternal:
			open, closing = "([", "])"
		}
		fmt.Fprintf(&b, "    %s%s\"%s\"%s\n", id, open, mermaidLabel(v.lines), closing)
	}
	var styles []string
	for i, s := range m.Sessions {
		dotted := s.State() == StateConfigured
		fmt.Fprintf(&b, "    %s %s|\"%s\"| %s\n", ids[s.A], mermaidLink(s, dotted), mermaidLabel(edgeLines(s)), ids[s.B])
		styles = append(styles, fmt.Sprintf("    linkStyle %d stroke:%s,color:%s", i, edgeColour(s), edgeColour(s)))
	}
	for _, v := range m.vertices() {
		if v.kind == kindReflector {
			fmt.Fprintf(&b, "    style %s fill:%s\n", ids[v.id], colourReflector)
		}
	}
	for _, s := range styles {
		b.WriteString(s + "\n")
	}
	return b.String()
}

// mermaidLink is the link between a session's ends: a line, an arrow
// from a reflector, arrows both ways; dotted when only configured.
func mermaidLink(s Session, dotted bool) string {
	switch {
	case s.BothReflect && dotted:
		return "<-.->"
	case s.BothReflect:
		return "<-->"
	case s.Reflects && dotted:
		return "-.->"
	case s.Reflects:
		return "-->"
	case dotted:
		return "-.-"
	}
	return "---"
}

// mermaidEscape keeps text inside a quoted Mermaid label: Mermaid reads
// #name; entities there, and quotes, angle brackets (HTML), pipes (edge
// label ends) and backticks (markdown strings) would end or change it.
var mermaidEscape = strings.NewReplacer(
	"#", "#35;", `"`, "#quot;", "<", "#lt;", ">", "#gt;", "|", "#124;", "`", "#96;",
	"\r\n", " ", "\n", " ", "\r", " ")

// mermaidLabel is lines as one quoted Mermaid label (without the quotes).
func mermaidLabel(lines []string) string {
	q := make([]string, len(lines))
	for i, l := range lines {
		q[i] = mermaidEscape.Replace(l)
	}
	return strings.Join(q, "<br/>")
}

// mermaidTitle is the title as a YAML string for Mermaid's front matter.
func mermaidTitle(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", " ", "\r", " ")
	return `"` + r.Replace(s) + `"`
}
