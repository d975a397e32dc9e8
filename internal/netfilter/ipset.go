package netfilter

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// IPSets drives the kernel's ipsets. It is the one mechanism for sets, for
// NAT's few members as for NetworkPolicy's hundred thousand: a batch of
// any size is applied in order, over netlink when it can be, and with one
// `ipset restore` otherwise, whose errors name the line (and so the
// member) the kernel refused (Apply). Sets are read with the ipset
// program.
type IPSets struct {
	path string
	// NoNetlink sends every batch through the ipset program (Apply).
	NoNetlink bool
	// revs remembers the kernel's newest revision of each set type, by
	// "type family" (revision).
	revs *sync.Map
}

// NewIPSets uses the ipset program at path ("": found in $PATH).
func NewIPSets(path string) (*IPSets, error) {
	if path == "" {
		p, err := exec.LookPath("ipset")
		if err != nil {
			return nil, fmt.Errorf("the ipset command is needed: %w (install ipset)", err)
		}
		path = p
	}
	return &IPSets{path: path, revs: &sync.Map{}}, nil
}

// Set is one set as `ipset save` prints it.
type Set struct {
	Type   string // hash:net …
	Family string // inet, inet6
	// Members maps a member, as printed, to its nomatch flag.
	Members map[string]bool
}

// Apply applies batch in order; with exist, adding a member that is there
// (which also updates its nomatch flag), deleting one that is not and
// creating a set that exists with the same options are not errors. An
// empty batch runs nothing.
//
// An exist batch of creates, adds and deletes of members netlink carries
// (sets of the types tabby uses, told with Typed or created in the batch)
// goes over netlink, in the namespace of the calling thread as ipset
// would, with no program started (applyNetlink). Anything else, and a
// batch the kernel refused some of over netlink, runs as one `ipset
// restore`: replaying an exist batch is harmless, and restore's error
// names the line it stopped at.
func (s *IPSets) Apply(ctx context.Context, batch *SetBatch, exist bool) error {
	if batch.Empty() {
		return nil
	}
	if !s.NoNetlink && exist {
		if err := s.applyNetlink(ctx, batch); err == nil || ctx.Err() != nil {
			return err
		}
	}
	args := []string{"restore"}
	if exist {
		args = []string{"-exist", "restore"}
	}
	_, err := run(ctx, batch.String(), s.path, args...)
	return err
}

// Save reads every set whose name starts with prefix, with its members;
// everyone else's are skipped.
func (s *IPSets) Save(ctx context.Context, prefix string) (map[string]*Set, error) {
	return s.StartSave(ctx, prefix)()
}

// StartSave starts Save's `ipset save` from the calling thread (so in its
// network namespace) and returns at once: wait returns what Save would.
func (s *IPSets) StartSave(ctx context.Context, prefix string) (wait func() (map[string]*Set, error)) {
	w := start(ctx, "", s.path, "save")
	return func() (map[string]*Set, error) {
		out, err := w()
		if err != nil {
			return nil, fmt.Errorf("reading the ipsets: %w (does the kernel have ipset support? load ip_set and its hash modules)", err)
		}
		return ParseIPSetSave(out, prefix)
	}
}

// Get reads the sets names that exist, by name: the others are missing
// from the map. It costs one `ipset list -n` and one `ipset save NAME` a
// set found, however large everyone else's sets are.
func (s *IPSets) Get(ctx context.Context, names ...string) (map[string]*Set, error) {
	have, err := s.Names(ctx)
	if err != nil {
		return nil, err
	}
	return s.GetListed(ctx, have, names...)
}

// GetListed is Get for a caller that has the names of the sets in the
// kernel already (Names), for several Gets in a row.
func (s *IPSets) GetListed(ctx context.Context, listed []string, names ...string) (map[string]*Set, error) {
	sets := map[string]*Set{}
	for _, name := range names {
		if !slices.Contains(listed, name) {
			continue
		}
		out, err := run(ctx, "", s.path, "save", name)
		if err != nil {
			return nil, fmt.Errorf("reading the ipset %s: %w", name, err)
		}
		one, err := ParseIPSetSave(out, name)
		if err != nil {
			return nil, err
		}
		if one[name] != nil {
			sets[name] = one[name]
		}
	}
	return sets, nil
}

// Names lists the names of every set in the kernel.
func (s *IPSets) Names(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "", s.path, "list", "-n")
	if err != nil {
		return nil, fmt.Errorf("listing the ipsets: %w (does the kernel have ipset support? load ip_set and its hash modules)", err)
	}
	return strings.Fields(out), nil
}

// Destroy destroys the sets names, in one `ipset restore` when it can.
// When that fails (a rule still names one of them) restore has stopped at
// that set, so it destroys those still there one by one, and returns
// those destroyed and an error naming the others.
func (s *IPSets) Destroy(ctx context.Context, names []string) ([]string, error) {
	var b SetBatch
	for _, n := range names {
		b.Destroy(n)
	}
	if err := s.Apply(ctx, &b, false); err == nil {
		return names, nil
	}
	left, err := s.Names(ctx)
	if err != nil {
		return nil, err
	}
	var done, errs []string
	for _, n := range names {
		if !slices.Contains(left, n) {
			done = append(done, n)
			continue
		}
		if _, err := run(ctx, "", s.path, "destroy", n); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		done = append(done, n)
	}
	if len(errs) > 0 {
		return done, errors.New(strings.Join(errs, "; "))
	}
	return done, nil
}

// ParseIPSetSave reads `ipset save` output and returns the sets whose names
// start with prefix.
func ParseIPSetSave(save, prefix string) (map[string]*Set, error) {
	sets := map[string]*Set{}
	for _, line := range strings.Split(save, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], prefix) {
			continue
		}
		switch f[0] {
		case "create":
			s := &Set{Type: f[2], Members: map[string]bool{}}
			for i := 3; i+1 < len(f); i++ {
				if f[i] == "family" {
					s.Family = f[i+1]
				}
			}
			sets[f[1]] = s
		case "add":
			s := sets[f[1]]
			if s == nil {
				return nil, fmt.Errorf("ipset save lists a member of %s before creating it: %q", f[1], line)
			}
			s.Members[f[2]] = len(f) > 3 && f[3] == "nomatch"
		}
	}
	return sets, nil
}

// SetBatch is a list of ipset commands, applied in order by Apply: as
// one `ipset restore` input (String), or as netlink requests.
type SetBatch struct {
	lines []setLine
	// types are the set types Typed told, and those of the sets the
	// batch creates.
	types map[string]string
}

// setLine is one command of a batch.
type setLine struct {
	verb    string // create, add, del, destroy
	set     string
	member  string // add, del: as `ipset save` prints it
	nomatch bool
	// create: the type, the family and the options as given.
	typ, family string
	options     []string
}

// Typed tells the batch the type of set name (hash:ip …): members of sets
// of known type may go over netlink.
func (b *SetBatch) Typed(name, typ string) {
	if b.types == nil {
		b.types = map[string]string{}
	}
	b.types[name] = typ
}

// Create creates set name of type typ and family (inet, inet6); options
// follow as given (hashsize 64 maxelem 1048576 …).
func (b *SetBatch) Create(name, typ, family string, options ...string) {
	b.lines = append(b.lines, setLine{verb: "create", set: name, typ: typ, family: family, options: options})
	b.Typed(name, typ)
}

// Add adds member (as `ipset save` prints it) to set name.
func (b *SetBatch) Add(name, member string, nomatch bool) {
	b.lines = append(b.lines, setLine{verb: "add", set: name, member: member, nomatch: nomatch})
}

// Del deletes member from set name.
func (b *SetBatch) Del(name, member string) {
	b.lines = append(b.lines, setLine{verb: "del", set: name, member: member})
}

// Destroy destroys set name.
func (b *SetBatch) Destroy(name string) {
	b.lines = append(b.lines, setLine{verb: "destroy", set: name})
}

// Append adds o's commands after b's.
func (b *SetBatch) Append(o *SetBatch) {
	b.lines = append(b.lines, o.lines...)
	for name, typ := range o.types {
		b.Typed(name, typ)
	}
}

// Empty says the batch has no command.
func (b *SetBatch) Empty() bool { return len(b.lines) == 0 }

// String is the restore input, a line a command. A policy sync adds up to
// a million members, so it writes straight into one builder.
func (b *SetBatch) String() string {
	var w strings.Builder
	for _, l := range b.lines {
		switch l.verb {
		case "create":
			w.WriteString(strings.Join(append([]string{"create", l.set, l.typ, "family", l.family}, l.options...), " "))
		case "add", "del":
			w.WriteString(l.verb)
			w.WriteByte(' ')
			w.WriteString(l.set)
			w.WriteByte(' ')
			writeMember(&w, l.member)
			if l.nomatch {
				w.WriteString(" nomatch")
			}
		default:
			w.WriteString(l.verb + " " + l.set)
		}
		w.WriteByte('\n')
	}
	return w.String()
}

// writeMember writes member as restore takes it best. A hash:ip,port
// member's protocol goes by number: ipset looks a name up with
// getprotobyname, which reads /etc/protocols again for every line
// (restoring 10,000 "ip,tcp:port" members took about twice as long as
// with "ip,6:port"). ipset save prints the name either way. An interface
// name cannot hold ':', so "ip,iface" and "ip,physdev:iface" members are
// left alone.
func writeMember(w *strings.Builder, member string) {
	if addr, rest, ok := strings.Cut(member, ","); ok {
		if proto, port, ok := strings.Cut(rest, ":"); ok {
			if n, ok := protoNumbers[proto]; ok {
				w.WriteString(addr)
				w.WriteByte(',')
				w.WriteString(strconv.Itoa(int(n)))
				w.WriteByte(':')
				w.WriteString(port)
				return
			}
		}
	}
	w.WriteString(member)
}

// protoNumbers are the protocol numbers of the names a hash:ip,port
// member carries ("10.0.0.1,tcp:80").
var protoNumbers = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}
