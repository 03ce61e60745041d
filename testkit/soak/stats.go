package soak

import (
	"math"
	"time"
)

// Hist is a latency histogram with logarithmic buckets 1% wide, from 1 µs
// to about 100 s: bounded memory at any message rate, quantiles within 1%.
type Hist struct {
	counts []uint64
	n      uint64
	// Early counts values below zero (recorded as zero): a message seen
	// before the time it was compared with.
	Early uint64
	max   time.Duration
}

const (
	histGrowth  = 1.01
	histBuckets = 1900 // 1.01^1900 µs ≈ 160 s
)

var histLogGrowth = math.Log(histGrowth)

func histIndex(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		return 0
	}
	i := int(math.Log(us)/histLogGrowth) + 1
	return min(i, histBuckets-1)
}

// histUpper is the largest value bucket i holds.
func histUpper(i int) time.Duration {
	if i == 0 {
		return time.Microsecond
	}
	return time.Duration(math.Pow(histGrowth, float64(i)) * float64(time.Microsecond))
}

// Add records one value.
func (h *Hist) Add(d time.Duration) {
	if h.counts == nil {
		h.counts = make([]uint64, histBuckets)
	}
	if d < 0 {
		h.Early++
		d = 0
	}
	h.counts[histIndex(d)]++
	h.n++
	h.max = max(h.max, d)
}

// Count is the number of values recorded.
func (h *Hist) Count() uint64 { return h.n }

// Max is the largest value recorded.
func (h *Hist) Max() time.Duration { return h.max }

// Quantile returns the value at quantile q (0..1): the upper bound of the
// bucket holding it, capped at the largest value seen. Zero when empty.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(histUpper(i), h.max)
		}
	}
	return h.max
}

// Merge adds o's values to h.
func (h *Hist) Merge(o *Hist) {
	if o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, histBuckets)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.Early += o.Early
	h.max = max(h.max, o.max)
}

// LagStats is a histogram's summary in milliseconds, for reports.
type LagStats struct {
	Count uint64  `json:"count"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
	Early uint64  `json:"early,omitempty"`
}

// Stats summarises h.
func (h *Hist) Stats() LagStats {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return LagStats{Count: h.n, P50ms: ms(h.Quantile(0.5)), P99ms: ms(h.Quantile(0.99)), MaxMs: ms(h.max), Early: h.Early}
}

// LinearFit returns the least-squares slope (units of y per unit of x) and
// intercept of y over x. Fewer than two distinct x give slope 0.
func LinearFit(x, y []float64) (slope, intercept float64) {
	n := float64(len(x))
	if len(x) != len(y) || len(x) == 0 {
		return 0, 0
	}
	var sx, sy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range x {
		sxx += (x[i] - mx) * (x[i] - mx)
		sxy += (x[i] - mx) * (y[i] - my)
	}
	if sxx == 0 {
		return 0, my
	}
	slope = sxy / sxx
	return slope, my - slope*mx
}

// Growth is the verdict of a linear fit over the tail of a run.
type Growth struct {
	Metric string `json:"metric"`
	// Note qualifies the window (a run too short for the full window).
	Note string `json:"note,omitempty"`
	// Window is the span of the samples fitted, in seconds.
	WindowS int `json:"window_s"`
	Samples int `json:"samples"`
	// MeanMiB and SlopeMiBPerMin describe the fit.
	MeanMiB        float64 `json:"mean_mib"`
	SlopeMiBPerMin float64 `json:"slope_mib_per_min"`
	// LimitMiBPerMin is the slope above which the metric counts as growing:
	// max(the absolute floor, the relative limit × the mean).
	LimitMiBPerMin float64 `json:"limit_mib_per_min"`
	Growing        bool    `json:"growing"`
	// Judged is false when the metric is informational only.
	Judged bool `json:"judged"`
}

// GrowthLimit says when a series counts as still growing: a fitted slope
// above max(AbsMiBPerMin, RelPerMin × the mean).
type GrowthLimit struct {
	AbsMiBPerMin float64
	RelPerMin    float64
}

// FitGrowth fits bytes over seconds and judges it against lim.
func FitGrowth(metric string, seconds, bytes []float64, lim GrowthLimit, judged bool) Growth {
	const mib = 1 << 20
	g := Growth{Metric: metric, Samples: len(seconds), Judged: judged}
	if len(seconds) == 0 {
		return g
	}
	g.WindowS = int(math.Round(seconds[len(seconds)-1] - seconds[0]))
	slope, _ := LinearFit(seconds, bytes)
	var sum float64
	for _, b := range bytes {
		sum += b
	}
	g.MeanMiB = sum / float64(len(bytes)) / mib
	g.SlopeMiBPerMin = slope * 60 / mib
	g.LimitMiBPerMin = max(lim.AbsMiBPerMin, lim.RelPerMin*g.MeanMiB)
	g.Growing = len(seconds) >= 3 && g.SlopeMiBPerMin > g.LimitMiBPerMin
	return g
}
