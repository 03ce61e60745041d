package amqp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// journalName is the durable queue that is a shard's journal.
func journalName(cluster, shard string) string {
	if shard != "" {
		shard = "." + shard
	}
	return "beatd.journal." + cluster + shard
}

// lockName is the exclusive queue that is a shard's fence lock
// (shard "": the unsharded cluster's).
func lockName(cluster, shard string) string {
	if shard != "" {
		shard = "." + shard
	}
	return "beatd.fence." + cluster + shard
}

// CheckResizable checks, before a resize from one shard count to another
// moves anything, that no replica of the old count can still publish and
// that every old shard's journal is settled. It takes the fence lock of
// every shard of both counts (1: the unsharded lock), failing with the
// first one a connection still holds, and reads each old shard's journal:
// its newest record must be a clean end (CloseTerm), else that shard's
// last term published batches its state table may lack, which only the
// old shard's next leader can settle (the journal is the shard's, and the
// entries move to shards that read another). The locks are released when
// it returns. A resize calls it while every
// replica is stopped: an entry that moves changes lock, so a replica of
// the old count that was paused through the resize, its connection still
// open, could otherwise publish a moved entry's slot under its old lock
// when it wakes. A lock that is free has no connection left holding it,
// and a woken replica that reconnects checks its term in etcd (Verify),
// where its election key is gone.
func CheckResizable(url, password, cluster string, from, to int) error {
	urls, err := ParseAMQPURLs(url, password)
	if err != nil {
		return err
	}
	conn, err := dialAny(urls, "beatd resize "+cluster)
	if err != nil {
		return err
	}
	defer conn.Close() // releases every lock taken here
	seen := map[string]bool{}
	for _, n := range []int{from, to} {
		for i := range n {
			shard := ""
			if n > 1 {
				shard = strconv.Itoa(i)
			}
			name := lockName(cluster, shard)
			if seen[name] {
				continue
			}
			seen[name] = true
			ch, err := conn.Channel()
			if err != nil {
				return fmt.Errorf("amqp: open channel: %w", err)
			}
			_, err = ch.QueueDeclare(name, false, false, true, false, nil)
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
				return fmt.Errorf("amqp: the fence lock %s is held by a connection: a replica of the old count still runs (paused or cut off); once RabbitMQ's heartbeat timeout closes its connection, rerun", name)
			}
			if err != nil {
				return fmt.Errorf("amqp: take the fence lock %s: %w", name, err)
			}
			_ = ch.Close()
		}
	}
	for i := range from {
		shard := ""
		if from > 1 {
			shard = strconv.Itoa(i)
		}
		name := journalName(cluster, shard)
		rec, ok, err := newestRecord(conn, name)
		if err != nil {
			return err
		}
		if ok && rec.Kind != kindClosed {
			return fmt.Errorf("amqp: shard %s's last term (token %d) ended without writing its state behind every batch its journal %s records (a lost lease or a kill): start every replica with --shards %d, let every shard be led, stop them with SIGTERM, then resize", cmp.Or(shard, "0"), rec.Token, name, from)
		}
	}
	return nil
}

// newestRecord reads a journal without consuming it (the records go back
// when the channel closes) and returns its newest record.
func newestRecord(conn *amqp.Connection, name string) (journalRecord, bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return journalRecord{}, false, fmt.Errorf("amqp: open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclarePassive(name, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return journalRecord{}, false, nil // no term ever published
		}
		return journalRecord{}, false, fmt.Errorf("amqp: read journal %s: %w", name, err)
	}
	var newest journalRecord
	found := false
	for range 2 * journalMaxLength {
		m, ok, err := ch.Get(name, false)
		if err != nil {
			return journalRecord{}, false, fmt.Errorf("amqp: read journal %s: %w", name, err)
		}
		if !ok {
			break
		}
		var r journalRecord
		if json.Unmarshal(m.Body, &r) != nil {
			continue
		}
		if !found || r.Token > newest.Token || r.Token == newest.Token && r.Seq >= newest.Seq {
			newest, found = r, true
		}
	}
	return newest, found, nil
}

// CloseTerm records that token's term ended cleanly: every batch it sent
// is in its state table (the scheduler calls it once its last state write
// succeeded). A resize checks for it (CheckResizable). It needs no lock,
// and is written on a connection of its own, since the term's was closed
// as the term ended: a clean end is true whenever it is written, and a
// newer term's records rank above it.
//
// A term that never read the journal (it could not fence) settled nothing
// of its predecessors', so it records nothing: the journal keeps ending in
// their records.
func (a *AMQP) CloseTerm(ctx context.Context, token int64) error {
	a.mu.Lock()
	if a.journalFor != token {
		a.mu.Unlock()
		return nil
	}
	a.seq++
	rec := journalRecord{Token: token, Seq: a.seq, Kind: kindClosed, Resends: a.cum}
	a.mu.Unlock()
	conn, err := dialAny(a.urls, "beatd "+a.opts.Cluster)
	if err != nil {
		return fmt.Errorf("amqp: close term: %w", err)
	}
	// A socket deadline is the OS's wall time, whatever the daemon's clock.
	defer conn.CloseDeadline(time.Now().Add(2 * time.Second))
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: close term: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("amqp: close term: confirm mode: %w", err)
	}
	if _, err := ch.QueueDeclare(a.journal, true, false, false, false, a.journalArgs()); err != nil {
		return fmt.Errorf("amqp: close term: declare journal %s: %w", a.journal, err)
	}
	if err := publishRecord(ctx, ch, a.journal, rec); err != nil {
		return fmt.Errorf("amqp: close term: %w", err)
	}
	return nil
}
