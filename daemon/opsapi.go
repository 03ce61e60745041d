package daemon

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/beatd/beatd/api"
	"github.com/beatd/beatd/internal/keys"
	"github.com/beatd/beatd/outcome"
	"github.com/beatd/beatd/scheduler"
	"github.com/beatd/beatd/store"
)

// Request implements api.Backend: the request and its audit record go to
// etcd in one transaction.
func (b *backend) Request(ctx context.Context, a api.Action) (string, error) {
	if e, err := b.entry(ctx, a.Entry); err != nil || e == nil {
		return "", cmp.Or(err, api.ErrUnknownEntry)
	}
	r := store.Request{Op: store.Op(a.Op), Entry: a.Entry, RespectOverlap: a.RespectOverlap, Actor: a.Who.Name, Note: a.Note}
	r, err := b.store.PutRequest(ctx, r, a.Audit(), b.clock.Now())
	return r.ID, err
}

// Audit implements api.Auditor.
func (b *backend) Audit(ctx context.Context, rec store.AuditRecord) error {
	return b.store.Audit(ctx, rec)
}

// AuditLog implements api.Auditor.
func (b *backend) AuditLog(ctx context.Context, entry string, limit int) ([]store.AuditRecord, error) {
	return b.store.AuditLog(ctx, entry, limit)
}

// Backfills implements api.OpsBackend.
func (b *backend) Backfills(ctx context.Context) ([]store.Backfill, error) {
	return b.store.Backfills(ctx)
}

// Backfill implements api.OpsBackend: it plans the backfill from what
// this replica reads (the entry's state in etcd, the broker's run
// history, the backfills on record), as the leader does when it starts
// the job, and queues the job unless it is a dry run.
func (b *backend) Backfill(ctx context.Context, spec api.BackfillSpec, a api.Action) (api.BackfillAnswer, error) {
	e, err := b.entry(ctx, a.Entry)
	if err != nil || e == nil {
		return api.BackfillAnswer{}, cmp.Or(err, api.ErrUnknownEntry)
	}
	now := b.clock.Now()
	if err := scheduler.CheckBackfillRange(spec.From, spec.To, now); err != nil {
		return api.BackfillAnswer{}, err
	}
	st, err := b.store.Get(ctx, e.Name)
	if err != nil {
		return api.BackfillAnswer{}, err
	}
	jobs, err := b.store.Backfills(ctx)
	if err != nil {
		return api.BackfillAnswer{}, err
	}
	var hist []outcome.Run
	if b.pub != nil {
		if hist, err = b.pub.Runs(ctx, e.Name); err != nil {
			return api.BackfillAnswer{}, fmt.Errorf("read the run history: %w", err)
		}
	}
	slots, err := scheduler.PlanBackfill(scheduler.BackfillInput{Entry: e, State: st, History: hist, Jobs: jobs,
		From: spec.From, To: spec.To, Now: now, Cluster: keys.Cluster(b.prefix)})
	if err != nil {
		return api.BackfillAnswer{}, err
	}
	ans := api.BackfillAnswer{Entry: e.Name, Slots: slots}
	for _, s := range slots {
		if s.Fired {
			ans.Fired++
		}
		if !s.Fired || spec.IncludeFired {
			ans.Publish++
		}
	}
	if ans.Slots == nil {
		ans.Slots = []scheduler.BackfillSlot{}
	}
	if spec.DryRun {
		return ans, nil
	}
	job := &store.Backfill{Entry: e.Name, From: spec.From.UTC(), To: spec.To.UTC(), Rate: spec.Rate, IncludeFired: spec.IncludeFired,
		Actor: a.Who.Name, Note: a.Note}
	rec := a.Audit()
	rec.Detail = fmt.Sprintf("%s to %s, %d slots at %g/s", job.From.Format(time.RFC3339), job.To.Format(time.RFC3339), ans.Publish, job.Rate)
	if spec.IncludeFired {
		rec.Detail += ", fired ones included"
	}
	if err := b.store.CreateBackfill(ctx, job, rec, now); err != nil {
		return ans, err
	}
	ans.Job = job
	return ans, nil
}

// CancelBackfill implements api.OpsBackend.
func (b *backend) CancelBackfill(ctx context.Context, id string, a api.Action) error {
	job, ok, err := b.store.Backfill(ctx, id)
	switch {
	case err != nil:
		return err
	case !ok:
		return api.ErrNoBackfill
	case !job.Unfinished():
		return fmt.Errorf("%w: %s is %s", api.ErrBackfillFinished, id, job.State)
	}
	a.Entry = job.Entry
	rec := a.Audit()
	rec.Detail = id
	_, err = b.store.PutRequest(ctx, store.Request{Op: store.OpCancelBackfill, Entry: job.Entry, Backfill: id, Actor: a.Who.Name, Note: a.Note}, rec, b.clock.Now())
	return err
}
