package schedule

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"
	"time"
)

type celeryVector struct {
	Spec  map[string]string `json:"spec"`
	Zone  string            `json:"zone"`
	From  string            `json:"from"`
	Steps []struct {
		Celery    string `json:"celery"`
		Oracle    string `json:"oracle"`
		Deviation string `json:"deviation"`
	} `json:"steps"`
}

// TestCeleryVectors compares Next with slots computed by Celery 5.2.6 and by
// an independent oracle (testdata/gen_celery_vectors.py explains both),
// chaining from each slot as beat does. beatd must equal the oracle always,
// and Celery except where the generator names a documented deviation.
func TestCeleryVectors(t *testing.T) {
	t.Parallel()
	f, err := os.Open("testdata/celery_vectors.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	cases, steps := 0, 0
	deviations := map[string]int{}
	for sc.Scan() {
		var v celeryVector
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		loc, err := time.LoadLocation(v.Zone)
		if err != nil {
			t.Fatal(err)
		}
		var masks [5]uint64
		for fi := Minute; fi <= MonthOfYear; fi++ {
			if masks[fi], err = ParseCrontabField(fi, v.Spec[fi.String()]); err != nil {
				t.Fatalf("%v: %v", v.Spec, err)
			}
		}
		c, err := NewCrontab(masks, loc)
		if err != nil {
			t.Fatalf("%v: %v", v.Spec, err)
		}
		last, err := time.Parse(time.RFC3339Nano, v.From)
		if err != nil {
			t.Fatal(err)
		}
		cases++
		for i, st := range v.Steps {
			steps++
			got := c.Next(last).Format(TimeLayout)
			if got != st.Oracle {
				t.Errorf("%v in %s after %s (step %d): got %s, want %s (Celery %s)",
					v.Spec, v.Zone, last.Format(time.RFC3339Nano), i, got, st.Oracle, st.Celery)
				break
			}
			switch st.Deviation {
			case "":
				if got != st.Celery {
					t.Errorf("%v in %s: got %s, Celery %s", v.Spec, v.Zone, got, st.Celery)
				}
			case "dst_gap", "celery_5_2_6_month_skip":
				deviations[st.Deviation]++
			default:
				t.Errorf("%v in %s: unexplained deviation %q", v.Spec, v.Zone, st.Deviation)
			}
			last, _ = time.Parse(time.RFC3339, got)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases < 1000 {
		t.Fatalf("only %d vectors read", cases)
	}
	t.Logf("%d cases, %d steps equal to the oracle; documented deviations from Celery 5.2.6: %v", cases, steps, deviations)
}
