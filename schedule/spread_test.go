package schedule

import (
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestSpreadHashGolden pins H's hash: these values must never change, or
// every hashed entry's slots move on upgrade. The definition is checked
// too, against the standard library's FNV-1a.
func TestSpreadHashGolden(t *testing.T) {
	tests := []struct {
		name, field string
		want        uint32
	}{
		{"", "minute", 0x01c58299},
		{"billing-report", "minute", 0x5edb2438},
		{"billing-report", "hour", 0x2d820464},
		{"tenant-42", "day_of_month", 0x831f2946},
		{"naïve café", "day_of_week", 0x5d876e68},
	}
	fmix32 := func(h uint32) uint32 {
		h ^= h >> 16
		h *= 0x85ebca6b
		h ^= h >> 13
		h *= 0xc2b2ae35
		return h ^ h>>16
	}
	for _, tt := range tests {
		if got := SpreadHash(tt.name, tt.field); got != tt.want {
			t.Errorf("SpreadHash(%q, %q) = %#08x, want %#08x", tt.name, tt.field, got, tt.want)
		}
		f := fnv.New32a()
		f.Write([]byte(tt.name + "\x00" + tt.field))
		if got := fmix32(f.Sum32()); got != tt.want {
			t.Errorf("fmix32(FNV-1a(%q NUL %q)) = %#08x, want %#08x: the documented definition", tt.name, tt.field, got, tt.want)
		}
	}
}

// spreadGolden is what H resolves to for two names: the same in every
// process (TestSpreadAcrossProcesses) and every release.
var spreadGolden = []struct{ name, expr, want string }{
	{"billing-report", "H * * * *", "22 * * * *"},
	{"billing-report", "H H(0-5) * * *", "22 1 * * *"},
	{"billing-report", "H(0-29)/10 * * * *", "3-29/10 * * * *"},
	{"billing-report", "H/15 H * * H", "5-59/15 4 * * 1"},
	{"billing-report", "0 0 H * *", "0 0 8 * *"},
	{"tenant-42", "H * * * *", "52 * * * *"},
	{"tenant-42", "H H(0-5) * * *", "52 1 * * *"},
	{"tenant-42", "H(0-29)/10 * * * *", "8-29/10 * * * *"},
	{"tenant-42", "H/15 H * * H", "13-59/15 7 * * 2"},
	{"tenant-42", "0 0 H * *", "0 0 15 * *"},
}

func resolvedGolden(t *testing.T) []string {
	var out []string
	for _, g := range spreadGolden {
		c, err := ParseCronFor(g.expr, g.name, time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, g.name+"|"+g.expr+"|"+c.Expr()+"|"+FormatSlot(c.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))))
	}
	return out
}

func TestSpreadGolden(t *testing.T) {
	for i, got := range resolvedGolden(t) {
		g := spreadGolden[i]
		if parts := strings.Split(got, "|"); parts[2] != g.want {
			t.Errorf("%s: %q resolves to %q, want %q", g.name, g.expr, parts[2], g.want)
		}
	}
}

// TestSpreadAcrossProcesses resolves the same expressions in a second
// process (this test binary, run again) and compares: H must not depend
// on anything a process picks at start, such as map or hash seeds.
func TestSpreadAcrossProcesses(t *testing.T) {
	if os.Getenv("BEATD_SPREAD_CHILD") == "1" {
		fmt.Println(strings.Join(resolvedGolden(t), "\n"))
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestSpreadAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "BEATD_SPREAD_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := resolvedGolden(t)
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	got = got[:min(len(got), len(want))] // the child's PASS line follows
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("second process resolved:\n%s\nthis one:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if want[0] == want[len(spreadGolden)/2] {
		t.Fatal("two names resolved alike")
	}
}

// TestSpreadIsUniform spreads 1,000 names over each field and checks the
// histogram against the uniform one. The names are fixed, so the result
// is too; the bounds (every bucket within half to double its share, and
// a chi-square below the 99.9th percentile) say the hash spreads, with
// room for a lesser hash to fail.
func TestSpreadIsUniform(t *testing.T) {
	const names = 1000
	for _, tt := range []struct {
		expr  string
		field int // index of the resolved field
		lo, n int
		chi   float64 // chi-square 99.9th percentile for n-1 degrees of freedom
	}{
		{"H * * * *", 0, 0, 60, 95.75},
		{"0 H * * *", 1, 0, 24, 49.73},
		{"0 0 H * *", 2, 1, 28, 55.48},
		{"0 0 * * H", 4, 0, 7, 22.46},
		{"H/15 * * * *", 0, 0, 15, 36.12},
	} {
		hist := make([]int, tt.n)
		for i := range names {
			r, _, err := ResolveCronSpread(tt.expr, fmt.Sprintf("tenant-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(r)[tt.field]
			var v int
			fmt.Sscanf(f, "%d", &v) // "7" or "7-59/15": the start
			hist[v-tt.lo]++
		}
		exp := float64(names) / float64(tt.n)
		chi := 0.0
		var b strings.Builder
		for i, c := range hist {
			chi += (float64(c) - exp) * (float64(c) - exp) / exp
			fmt.Fprintf(&b, "  %2d %3d %s\n", tt.lo+i, c, strings.Repeat("#", c/2))
			if float64(c) < exp/2 || float64(c) > exp*2 {
				t.Errorf("%s: value %d got %d of %d names, want within %.0f-%.0f", tt.expr, tt.lo+i, c, names, math.Ceil(exp/2), math.Floor(exp*2))
			}
		}
		t.Logf("%s over %d names (chi-square %.1f, limit %.1f):\n%s", tt.expr, names, chi, tt.chi, b.String())
		if chi > tt.chi {
			t.Errorf("%s: chi-square %.1f over %.1f: not uniform", tt.expr, chi, tt.chi)
		}
	}
}

func TestSpreadErrors(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"H(50-10) * * * *", "range 50-10 is empty"},
		{"H/0 * * * *", "step must be at least 1"},
		{"H(0-29)/0 * * * *", "step must be at least 1"},
		{"H(0-99) * * * *", "outside the field's 0-59"},
		{"0 H(0-24) * * *", "outside the field's 0-23"},
		{"0 0 H(0-10) * *", "outside the field's 1-31"},
		{"0 0 * H(1-13) *", "outside the field's 1-12"},
		{"0 0 * * H(1-7)", "outside the field's 0-6"},
		{"H(0-5)/10 * * * *", "step 10 is larger than the range 0-5"},
		{"H5 * * * *", "want H, H/STEP, H(LO-HI) or H(LO-HI)/STEP"},
		{"H/ * * * *", "want H"},
		{"H(5) * * * *", "want H"},
	}
	for _, tt := range tests {
		_, err := ParseCronFor(tt.expr, "e", time.UTC)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want one containing %q", tt.expr, err, tt.want)
		}
	}
	if _, err := ParseCron("H * * * *", time.UTC); err == nil || !strings.Contains(err.Error(), "entry's name") {
		t.Errorf("H without a name: %v", err)
	}
	for _, tt := range []struct {
		f          CrontabField
		spec, want string
	}{
		{Minute, "H(50-10)", "range 50-10 is empty"},
		{DayOfWeek, "H(0-9)", "outside the field's 0-6"},
		{Hour, "H/0", "step must be at least 1"},
	} {
		if _, _, err := ResolveCrontabField(tt.f, tt.spec, "e"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("crontab %s %q: error %v, want %q", tt.f, tt.spec, err, tt.want)
		}
	}
}

// TestSpreadCrontabMatchesCron: a crontab and a cron field of one kind
// resolve alike for one name, and a crontab keeps Celery's syntax.
func TestSpreadCrontabMatchesCron(t *testing.T) {
	ct, err := ParseCrontabFor("H/15 H(9-17) * * *", "billing-report", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCronFor("H/15 H(9-17) * * *", "billing-report", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for range 20 {
		a, b := ct.Next(from), c.Next(from)
		if !a.Equal(b) {
			t.Fatalf("crontab %v, cron %v after %v", a, b, from)
		}
		from = a
	}
	if s, ok := Spread(ct); !ok || !strings.Contains(s, "minute=5,20,35,50") {
		t.Errorf("Spread(crontab) = %q, %v", s, ok)
	}
	if s, ok := Spread(&NotBefore{Schedule: c}); !ok || s != "5-59/15 10 * * *" {
		t.Errorf("Spread(cron) = %q, %v", s, ok)
	}
	if got := c.String(); got != "cron(5-59/15 10 * * *) from H/15 H(9-17) * * *" {
		t.Errorf("String() = %q", got)
	}
}
