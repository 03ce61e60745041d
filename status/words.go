package status

import (
	"time"

	"github.com/beatd/beatd/outcome"
)

// The words status shows have one home each: a publish's result is
// broker.Result's word (ok, duplicate, stale, error) or the scheduler's
// manual or backfill label; a run's outcome is outcome.Kind's word
// (published, received, started, retried, succeeded, failed, revoked,
// expired, lost, skipped, unreported). docs/outcomes.md lists them. The
// renderers put them together only through the functions below.

// ResultWords is a fire's result as the console shows it: the word, and
// "(manual)" after a trigger's.
func ResultWords(result string, manual bool) string {
	if manual {
		return result + " (manual)"
	}
	return result
}

// ResultText is the entry's last publish result, with the leader's flag
// (behind, runaway) when it has one: "ok (behind)".
func (e *Entry) ResultText() string {
	switch {
	case e.Health == "":
		return e.LastResult
	case e.LastResult == "":
		return e.Health
	}
	return e.LastResult + " (" + e.Health + ")"
}

// LastOutcome is what the workers reported about the newest run that was
// published (a skipped slot was not); empty when none is known.
func (e *Entry) LastOutcome() string {
	for _, r := range e.Runs {
		if r.Outcome != outcome.Skipped.String() {
			return r.Outcome
		}
	}
	return ""
}

// OutcomeOf finds what the workers reported about run among the entry's
// kept outcomes: a scheduled run by its slot, a manual one by its task
// id; nil when none is kept.
func (e *Entry) OutcomeOf(run outcome.Run) *RunOutcome {
	for i := range e.Runs {
		r := &e.Runs[i]
		if r.Outcome == outcome.Skipped.String() {
			continue
		}
		if run.Manual && r.Manual && r.TaskID == run.TaskID || !run.Manual && !r.Manual && r.Slot.Equal(run.Slot) {
			return r
		}
	}
	return nil
}

// Runtime is the run's runtime on its worker, zero when not reported.
func (r *RunOutcome) Runtime() time.Duration {
	return time.Duration(r.RuntimeSeconds * float64(time.Second))
}

// OutcomeText is the run's outcome with, for a chain's, the step it is
// at or ended at: "failed at step 2/3 etl.transform".
func (r *RunOutcome) OutcomeText() string {
	switch {
	case r.Step == "":
		return r.Outcome
	case outcomeEnded(r.Outcome):
		return r.Outcome + " at " + r.Step
	}
	return r.Outcome + ", " + r.Step
}

// outcomeEnded says whether outcome, a Kind's word, ends a run.
func outcomeEnded(word string) bool {
	k, err := outcome.ParseKind(word)
	return err == nil && k.Finished()
}

// ExceptionText is the run's exception and its message, "Type: message".
func (r *RunOutcome) ExceptionText() string {
	if r.Message != "" {
		return r.Exception + ": " + r.Message
	}
	return r.Exception
}
