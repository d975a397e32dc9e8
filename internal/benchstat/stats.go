// Package benchstat holds the small statistics the benchmarks report.
package benchstat

import "slices"

// Median is the middle of xs (the mean of the two middle values when
// there is an even number of them), 0 for none. xs is not changed.
func Median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
