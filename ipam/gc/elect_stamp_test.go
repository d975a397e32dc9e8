package gc

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestStamp: the record a candidate writes, as client-go's elector writes
// it: a new Lease starts at 0 transitions; taking one over from another
// holder or from none counts one and sets the acquire time; the holder's
// renewal keeps both.
func TestStamp(t *testing.T) {
	then := metav1.NewMicroTime(time.Unix(1000, 0))
	now := time.Unix(2000, 0)
	lease := func(rv, holder string, transitions int32) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", ResourceVersion: rv}}
		if rv != "" {
			l.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](3),
				AcquireTime: &then, RenewTime: &then, LeaseTransitions: ptr.To(transitions)}
		}
		return l
	}
	for _, tc := range []struct {
		name            string
		in              *coordinationv1.Lease
		wantTransitions int32
		wantAcquire     time.Time
	}{
		{"new Lease", lease("", "", 0), 0, now},
		{"taken over", lease("7", "other", 4), 5, now},
		{"taken after a release", lease("7", "", 4), 5, now},
		{"renewed", lease("7", "me", 4), 4, then.Time},
	} {
		t.Run(tc.name, func(t *testing.T) {
			el := &elector{e: Election{Identity: "me", LeaseDuration: 15 * time.Second}}
			el.stamp(tc.in, now)
			s := tc.in.Spec
			if ptr.Deref(s.HolderIdentity, "") != "me" || ptr.Deref(s.LeaseDurationSeconds, 0) != 15 ||
				s.RenewTime == nil || !s.RenewTime.Time.Equal(now) {
				t.Errorf("holder %v, duration %v, renewed %v; want me, 15, %v", ptr.Deref(s.HolderIdentity, ""), ptr.Deref(s.LeaseDurationSeconds, 0), s.RenewTime, now)
			}
			if got := ptr.Deref(s.LeaseTransitions, -1); got != tc.wantTransitions {
				t.Errorf("transitions %d, want %d", got, tc.wantTransitions)
			}
			if s.AcquireTime == nil || !s.AcquireTime.Time.Equal(tc.wantAcquire) {
				t.Errorf("acquired %v, want %v", s.AcquireTime, tc.wantAcquire)
			}
		})
	}
}

// TestSameRecord: a record differs when any of its fields does.
func TestSameRecord(t *testing.T) {
	t0, t1 := metav1.NewMicroTime(time.Unix(1, 0)), metav1.NewMicroTime(time.Unix(2, 0))
	base := coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a"), LeaseDurationSeconds: ptr.To[int32](15),
		AcquireTime: &t0, RenewTime: &t0, LeaseTransitions: ptr.To[int32](1)}
	if !sameRecord(base, *base.DeepCopy()) {
		t.Error("a copy differs")
	}
	for name, change := range map[string]func(*coordinationv1.LeaseSpec){
		"holder":      func(s *coordinationv1.LeaseSpec) { s.HolderIdentity = ptr.To("b") },
		"duration":    func(s *coordinationv1.LeaseSpec) { s.LeaseDurationSeconds = ptr.To[int32](1) },
		"renewed":     func(s *coordinationv1.LeaseSpec) { s.RenewTime = &t1 },
		"acquired":    func(s *coordinationv1.LeaseSpec) { s.AcquireTime = nil },
		"transitions": func(s *coordinationv1.LeaseSpec) { s.LeaseTransitions = ptr.To[int32](2) },
	} {
		s := base.DeepCopy()
		change(s)
		if sameRecord(base, *s) {
			t.Errorf("a changed %s is the same record", name)
		}
	}
}
