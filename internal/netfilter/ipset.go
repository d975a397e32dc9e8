package netfilter

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// IPSets drives the ipset program. It is the one mechanism for sets, for
// NAT's few members as for NetworkPolicy's hundred thousand: a batch of
// any size is one `ipset restore`, applied line by line in order, and its
// errors name the line (and so the member) the kernel refused. A batch of
// a few member changes of sets whose type the caller told (SetBatch.Typed)
// goes over netlink instead (Apply).
type IPSets struct {
	path string
	// NoNetlink sends every batch through the ipset program, even a few
	// member changes (Apply).
	NoNetlink bool
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
	return &IPSets{path: path}, nil
}

// Set is one set as `ipset save` prints it.
type Set struct {
	Type   string // hash:net …
	Family string // inet, inet6
	// Members maps a member, as printed, to its nomatch flag.
	Members map[string]bool
}

// Apply runs batch with one `ipset restore`; with exist, adding a member
// that is there (which also updates its nomatch flag), deleting one that
// is not and creating a set that exists with the same options are not
// errors. An empty batch runs nothing. A batch of a few member changes
// (at most NetlinkMax, none nomatch, of sets whose type it was told) goes
// over netlink instead, in the namespace of the calling thread as ipset
// would: a label change costs microseconds, not a process.
func (s *IPSets) Apply(ctx context.Context, batch *SetBatch, exist bool) error {
	if batch.Empty() {
		return nil
	}
	if !s.NoNetlink {
		if done, err := s.applyNetlink(ctx, batch, exist); done {
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
	out, err := run(ctx, "", s.path, "save")
	if err != nil {
		return nil, fmt.Errorf("reading the ipsets: %w (does the kernel have ipset support? load ip_set and its hash modules)", err)
	}
	return ParseIPSetSave(out, prefix)
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

// SetBatch is the input of one `ipset restore`.
type SetBatch struct {
	n int
	b strings.Builder
	// ops are the member changes, for netlink, while there are at most
	// NetlinkMax; other says the batch holds something else (a create, a
	// destroy, a nomatch member), which only restore carries.
	ops   []memberOp
	other bool
	// types are the set types Typed told.
	types map[string]string
}

// Typed tells the batch the type of set name (hash:ip …): members of sets
// of known type may go over netlink.
func (b *SetBatch) Typed(name, typ string) {
	if b.types == nil {
		b.types = map[string]string{}
	}
	b.types[name] = typ
}

func (b *SetBatch) words(w ...string) {
	b.b.WriteString(strings.Join(w, " "))
	b.b.WriteByte('\n')
	b.n++
	b.other = true
}

// op records a member change for netlink.
func (b *SetBatch) op(del bool, name, member string, nomatch bool) {
	if nomatch || b.other || len(b.ops) >= NetlinkMax {
		b.other = true
		b.ops = nil
		return
	}
	b.ops = append(b.ops, memberOp{del: del, set: name, member: member})
}

// Create creates set name of type typ and family (inet, inet6); options
// follow as given (hashsize 64 maxelem 1048576 …).
func (b *SetBatch) Create(name, typ, family string, options ...string) {
	b.words(append([]string{"create", name, typ, "family", family}, options...)...)
}

// Add adds member (as `ipset save` prints it) to set name.
// It writes straight into the batch: a policy sync adds up to a million.
func (b *SetBatch) Add(name, member string, nomatch bool) {
	b.op(false, name, member, nomatch)
	b.member("add ", name, member)
	if nomatch {
		b.b.WriteString(" nomatch")
	}
	b.b.WriteByte('\n')
}

// Del deletes member from set name.
func (b *SetBatch) Del(name, member string) {
	b.op(true, name, member, false)
	b.member("del ", name, member)
	b.b.WriteByte('\n')
}

func (b *SetBatch) member(verb, name, member string) {
	b.b.WriteString(verb)
	b.b.WriteString(name)
	b.b.WriteByte(' ')
	b.n++
	// A hash:ip,port member's protocol goes by number: ipset looks a
	// name up with getprotobyname, which reads /etc/protocols again for
	// every line (restoring 10,000 "ip,tcp:port" members took about
	// twice as long as with "ip,6:port"). ipset save prints the name
	// either way. An interface name cannot hold ':', so "ip,iface" and
	// "ip,physdev:iface" members are left alone.
	if addr, rest, ok := strings.Cut(member, ","); ok {
		if proto, port, ok := strings.Cut(rest, ":"); ok {
			if n, ok := protoNumbers[proto]; ok {
				b.b.WriteString(addr)
				b.b.WriteByte(',')
				b.b.WriteString(strconv.Itoa(int(n)))
				b.b.WriteByte(':')
				b.b.WriteString(port)
				return
			}
		}
	}
	b.b.WriteString(member)
}

// protoNumbers are the protocol numbers of the names a hash:ip,port
// member carries ("10.0.0.1,tcp:80").
var protoNumbers = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

// Destroy destroys set name.
func (b *SetBatch) Destroy(name string) { b.words("destroy", name) }

// Append adds o's lines after b's.
func (b *SetBatch) Append(o *SetBatch) {
	b.b.WriteString(o.b.String())
	b.n += o.n
	for name, typ := range o.types {
		b.Typed(name, typ)
	}
	if b.other || o.other || len(b.ops)+len(o.ops) > NetlinkMax {
		b.other, b.ops = true, nil
		return
	}
	b.ops = append(b.ops, o.ops...)
}

// Empty says the batch has no line.
func (b *SetBatch) Empty() bool { return b.n == 0 }

// String is the restore input.
func (b *SetBatch) String() string { return b.b.String() }
