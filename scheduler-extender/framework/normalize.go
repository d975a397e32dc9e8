package framework

// DefaultNormalizeScore is kube-scheduler's helper.DefaultNormalizeScore:
// scores scale so the highest becomes maxPriority; all zero stays zero (or
// all maxPriority when reverse, where fewer is better).
func DefaultNormalizeScore(maxPriority int64, reverse bool, scores []int64) {
	var top int64
	for _, s := range scores {
		top = max(top, s)
	}
	if top == 0 {
		if reverse {
			for i := range scores {
				scores[i] = maxPriority
			}
		}
		return
	}
	for i, s := range scores {
		s = maxPriority * s / top
		if reverse {
			s = maxPriority - s
		}
		scores[i] = s
	}
}
