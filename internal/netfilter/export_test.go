package netfilter

import "context"

// ApplyNetlink is applyNetlink, for the tests: the netlink path alone,
// with no fallback to restore.
func (s *IPSets) ApplyNetlink(ctx context.Context, b *SetBatch) error { return s.applyNetlink(ctx, b) }
