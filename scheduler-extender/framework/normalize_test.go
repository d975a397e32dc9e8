package framework

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultNormalizeScore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []int64
		reverse bool
		want    []int64
	}{
		{"scaled to the top, rounding down", []int64{0, 1, 3}, false, []int64{0, 33, 100}},
		{"reversed", []int64{0, 5, 10}, true, []int64{100, 50, 0}},
		{"all zero stays zero", []int64{0, 0}, false, []int64{0, 0}},
		{"all zero reversed is all max", []int64{0, 0}, true, []int64{100, 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := append([]int64(nil), tc.in...)
			DefaultNormalizeScore(MaxNodeScore, tc.reverse, got)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
}
