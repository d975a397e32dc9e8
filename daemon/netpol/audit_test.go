package netpol

import (
	"context"
	"log/slog"
	"testing"

	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// auditRecorder is an Applier whose Audit reports whether its context
// had ended, as apply.Applier's does when cut short during its read.
type auditRecorder struct{ audits, cut int }

func (a *auditRecorder) Apply(context.Context, *policy.Ruleset) (apply.Stats, error) {
	return apply.Stats{}, nil
}
func (a *auditRecorder) CheckJumps(context.Context) (int, error) { return 0, nil }
func (a *auditRecorder) Audit(ctx context.Context) (apply.Stats, error) {
	a.audits++
	if err := ctx.Err(); err != nil {
		a.cut++
		return apply.Stats{}, err
	}
	return apply.Stats{KernelRead: true}, nil
}

// TestAuditCutShortAtMostThrice: a change cuts an audit short, but not
// a fourth time in a row: on a node whose changes come faster than a read
// of the kernel takes, the audit still happens. A finished audit starts
// the count again.
func TestAuditCutShortAtMostThrice(t *testing.T) {
	a := &auditRecorder{}
	c := &Controller{cfg: Config{Applier: a}, log: slog.New(slog.DiscardHandler), met: newMetrics()}
	cut, cancel := context.WithCancel(context.Background())
	cancel() // a trigger arrived
	for range 3 {
		c.audit(cut)
	}
	if a.cut != 3 || !c.readAt.IsZero() {
		t.Fatalf("after 3 audits cut short: %d cut, read at %v; want 3, never", a.cut, c.readAt)
	}
	c.audit(cut)
	if a.audits != 4 || a.cut != 3 || c.readAt.IsZero() {
		t.Fatalf("the 4th audit: %d audits, %d cut, read at %v; want it run to its end", a.audits, a.cut, c.readAt)
	}
	c.audit(cut)
	if a.cut != 4 {
		t.Errorf("after a finished audit, the next was not cut short (%d cut)", a.cut)
	}
}
