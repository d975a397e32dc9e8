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

func TestExtenderScores(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sums  []int64
		total int64
		want  []int64
	}{
		// The example: rounding the lead over the lowest to the
		// nearest step gave 700 and 618 both 3; upstream ranks 700 first.
		{"near-equal sums are a step apart", []int64{700, 618, 350}, 1100, []int64{10, 9, 6}},
		{"a tie at the top stays a tie", []int64{500, 500, 499}, 1100, []int64{10, 10, 9}},
		{"every whole step behind costs one", []int64{1100, 990, 989, 880, 0}, 1100, []int64{10, 9, 8, 8, 0}},
		{"all equal are all top", []int64{0, 0}, 1100, []int64{10, 10}},
		{"no score plugins", []int64{0, 0}, 0, []int64{10, 10}},
		{"no nodes", []int64{}, 1100, []int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := append([]int64{}, tc.sums...)
			ExtenderScores(got, tc.total)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Error(d)
			}
		})
	}
}
