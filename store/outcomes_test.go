package store

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/outcome"
)

// TestOutcomesRoundTrip encodes states with and without outcomes: a bucket
// without any is written as format 2 (what earlier releases read), one with
// outcomes as format 3, one with a chain's run (its length and step) as
// format 4, and each decodes to what was stored.
func TestOutcomesRoundTrip(t *testing.T) {
	slot := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	full := &Outcomes{
		Failures: 2, LastSuccess: slot.Add(-time.Hour), LastFailure: slot.Add(1500 * time.Millisecond),
		PauseReason: "2 consecutive failures; last: ZeroDivisionError: division by zero", Buffered: slot.Add(time.Minute),
		Runs: []outcome.Run{
			{Slot: slot, Kind: outcome.Failed, PublishedAt: slot.Add(3 * time.Millisecond), Updated: slot.Add(time.Second),
				Started: slot.Add(500 * time.Millisecond), Runtime: 1234 * time.Microsecond, Worker: "celery@w1",
				ExcType: "ZeroDivisionError", ExcMsg: "division by zero"},
			{Slot: slot.Add(-time.Minute), Manual: true, TaskID: "0f679077-44ce-532c-9c82-f906c94d7265", Kind: outcome.Published,
				PublishedAt: slot.Add(-time.Minute)},
			{Slot: slot.Add(-2 * time.Minute), Kind: outcome.Skipped, PublishedAt: slot.Add(-3 * time.Minute), Skips: 60},
		},
	}
	for _, tc := range []struct {
		name   string
		out    *Outcomes
		format byte
	}{
		{"none", nil, 2},
		{"empty", &Outcomes{}, 3},
		{"full", full, 3},
		{"chained", &Outcomes{Failures: 1, Runs: []outcome.Run{
			{Slot: slot, Kind: outcome.Failed, PublishedAt: slot, Chain: 2, Step: 1, ExcType: "ValueError", ExcMsg: "asked to fail"},
			{Slot: slot.Add(-time.Minute), Kind: outcome.Succeeded, PublishedAt: slot.Add(-time.Minute), Chain: 2, Step: 2},
			{Slot: slot.Add(-2 * time.Minute), Kind: outcome.Succeeded, PublishedAt: slot.Add(-2 * time.Minute)},
		}}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := EntryState{Name: "e", LastSlot: slot, Since: slot.Add(-time.Hour), Out: tc.out}
			if tc.out != nil {
				st.Runs = 300 // a max_runs entry's count rides along
			}
			tab := NewTable()
			tab.Set(st)
			b := BucketOf("e")
			enc := tab.appendBucket(nil, b)
			if enc[0] != tc.format {
				t.Fatalf("format %d, want %d", enc[0], tc.format)
			}
			got, err := DecodeBucket(enc)
			if err != nil || len(got) != 1 {
				t.Fatalf("decode: %v %v", got, err)
			}
			if !reflect.DeepEqual(got[0], st) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got[0].Out, st.Out)
			}
			// Every truncation is refused, never misread.
			for n := 1; n < len(enc); n++ {
				if _, err := DecodeBucket(enc[:n]); err == nil && n < len(enc) {
					if recs, _ := DecodeBucket(enc[:n]); len(recs) == 1 && reflect.DeepEqual(recs[0], st) {
						t.Fatalf("truncated to %d bytes decodes as the whole", n)
					}
				}
			}
		})
	}
}

func TestOutcomesPush(t *testing.T) {
	var o Outcomes
	var dropped []time.Time
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range KeptRuns + 2 {
		if d := o.Push(outcome.Run{Slot: base.Add(time.Duration(i) * time.Second), Kind: outcome.Published}); d != nil {
			dropped = append(dropped, d.Slot)
		}
	}
	if len(o.Runs) != KeptRuns || !o.Runs[0].Slot.Equal(base.Add(time.Duration(KeptRuns+1)*time.Second)) {
		t.Fatalf("runs %+v", o.Runs)
	}
	if len(dropped) != 2 || !dropped[0].Equal(base) {
		t.Errorf("dropped %v", dropped)
	}
	o.Runs[0].Kind = outcome.Skipped
	if n := o.Newest(); n == nil || !n.Slot.Equal(o.Runs[1].Slot) {
		t.Errorf("newest skips skipped slots: %+v", n)
	}
	// The newest is a skip (marked above): two more join it.
	o.Skip(base.Add(time.Hour), base.Add(time.Hour))
	o.Skip(base.Add(time.Hour+time.Second), base.Add(time.Hour+time.Second))
	if len(o.Runs) != KeptRuns || o.Runs[0].Skips != 3 || o.Runs[1].Kind == outcome.Skipped {
		t.Errorf("skips not coalesced: %+v", o.Runs)
	}
	c := o.Clone()
	c.Runs[1].Kind = outcome.Failed
	if o.Runs[1].Kind == outcome.Failed {
		t.Error("Clone shares runs")
	}
}

// TestChainedRunCorrupt: a chain's run whose step is past its chain's
// length, or whose chain is empty, is refused rather than misread.
func TestChainedRunCorrupt(t *testing.T) {
	slot := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		chain, step byte
	}{
		{"step past the chain", 2, 3},
		{"empty chain", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := EntryState{Name: "e", LastSlot: slot, Out: &Outcomes{Runs: []outcome.Run{{Slot: slot, Kind: outcome.Started, PublishedAt: slot, Chain: 2, Step: 1}}}}
			tab := NewTable()
			tab.Set(st)
			enc := tab.appendBucket(nil, BucketOf("e"))
			i := strings.Index(string(enc), string([]byte{byte(outcome.Started) | kindChain, 2, 1}))
			if i < 0 {
				t.Fatalf("no chained run in %x", enc)
			}
			enc[i+1], enc[i+2] = tc.chain, tc.step
			if recs, err := DecodeBucket(enc); err == nil {
				t.Fatalf("decoded %+v", recs[0].Out.Runs)
			}
		})
	}
}
