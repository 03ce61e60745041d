package schedule

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"testing"
)

// TestFitSunCorrection refits sunLonFit, the correction of Meeus's
// low-accuracy solar longitude, against positions sampled from ephem
// (testdata/gen_sun_samples.py). It runs only when BEATD_FIT_SUN names the
// samples file, and prints the table for solar_fit.go.
func TestFitSunCorrection(t *testing.T) {
	path := os.Getenv("BEATD_FIT_SUN")
	if path == "" {
		t.Skip("set BEATD_FIT_SUN to a file written by testdata/gen_sun_samples.py")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var X [][]float64
	var y []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var jd, ra, dec, dist float64
		if _, err := fmt.Sscan(sc.Text(), &jd, &ra, &dec, &dist); err != nil {
			t.Fatal(err)
		}
		T := (jd + deltaT(jd)/86400 - 2451545) / 36525
		_, deps := nutation(T)
		eps := (meanObliquity(T) + deps/3600) * deg
		want := eclipticLongitude(ra, dec, eps)
		mra, mdec, _ := sunApparentUncorrected(jd)
		got := eclipticLongitude(mra, mdec, eps)
		X = append(X, sunFitRow(T))
		y = append(y, plusMinusPi(want-got)/deg*3600)
	}
	c := leastSquares(X, y)
	var before, after, worst float64
	for r, row := range X {
		p := 0.0
		for i := range row {
			p += row[i] * c[i]
		}
		before += y[r] * y[r]
		after += (y[r] - p) * (y[r] - p)
		worst = math.Max(worst, math.Abs(y[r]-p))
	}
	n := float64(len(y))
	t.Logf("longitude residual: rms %.2f″ before, %.2f″ after, worst %.2f″", math.Sqrt(before/n), math.Sqrt(after/n), worst)
	fmt.Printf("var sunLonFit = %#v\n", c)
}

func eclipticLongitude(ra, dec, eps float64) float64 {
	return math.Atan2(math.Sin(ra)*math.Cos(eps)+math.Tan(dec)*math.Sin(eps), math.Cos(ra))
}

// leastSquares solves the normal equations by Gauss-Jordan elimination
// with partial pivoting.
func leastSquares(X [][]float64, y []float64) []float64 {
	k := len(X[0])
	A := make([][]float64, k)
	for i := range A {
		A[i] = make([]float64, k+1)
	}
	for r, row := range X {
		for i := 0; i < k; i++ {
			for j := 0; j < k; j++ {
				A[i][j] += row[i] * row[j]
			}
			A[i][k] += row[i] * y[r]
		}
	}
	for i := 0; i < k; i++ {
		p := i
		for r := i + 1; r < k; r++ {
			if math.Abs(A[r][i]) > math.Abs(A[p][i]) {
				p = r
			}
		}
		A[i], A[p] = A[p], A[i]
		for r := 0; r < k; r++ {
			if r != i {
				f := A[r][i] / A[i][i]
				for c := i; c <= k; c++ {
					A[r][c] -= f * A[i][c]
				}
			}
		}
	}
	out := make([]float64, k)
	for i := range out {
		out[i] = A[i][k] / A[i][i]
	}
	return out
}
