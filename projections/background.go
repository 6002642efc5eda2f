package projections

import (
	"context"
	"errors"
	"maps"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/store"
)

// background is the recount of every queue that a term takes once it has
// caught up with its stream, and then every Config.ReconcileEvery, read
// while the batches go on rather than between two of them (0.6 s over
// 1,000,000 tasks, which the batches, and the leader's duties riding the
// stream, would wait for). It is a snapshot at at, the moment of the last
// event applied when it started. Until it is compared, since keeps what
// each batch added to each queue after that moment, so that the counters
// less since are the counters at at, which the recount must equal. It is
// only started when nothing is known to need a recount (no queue marked,
// no event the term could not place); any other recount still runs
// between batches.
type background struct {
	at     bson.Timestamp
	done   chan backgroundResult
	cancel context.CancelFunc // ends its read (the term's end)
	// since: per queue, what the batches added after at; skip: queues
	// whose counters moved otherwise meanwhile (another recount set them,
	// or a batch found them missing or moved by another term), left out
	// of the comparison; spoiled: a recount of every queue ran meanwhile,
	// or the stream restarted, and this one is dropped.
	since   map[bson.ObjectID]*store.QueueCounts
	skip    map[bson.ObjectID]bool
	spoiled bool
}

type backgroundResult struct {
	rc  store.Recount
	err error
}

// startBackground starts a recount of every queue at the position
// reached: the term's catch-up recount, or a periodic one.
func (p *projector) startBackground(ctx context.Context) {
	at := p.at
	ctx, cancel := context.WithCancel(ctx)
	bg := &background{at: at, done: make(chan backgroundResult, 1), cancel: cancel, since: map[bson.ObjectID]*store.QueueCounts{}, skip: map[bson.ObjectID]bool{}}
	p.bg, p.lastReconcile = bg, p.s.clock.Now()
	go func() {
		defer cancel()
		rc, err := p.s.cfg.Store.QueueRecount(ctx, store.QueueRecountParams{At: &at})
		bg.done <- backgroundResult{rc: rc, err: err}
	}()
}

// stop ends the background recount's read, if any, and waits for it: for
// the term's end, whatever ended it.
func (bg *background) stop() {
	if bg != nil {
		bg.cancel()
		<-bg.done
	}
}

// spoil drops the background recount, if any, when it is compared.
func (bg *background) spoil() {
	if bg != nil {
		bg.spoiled = true
	}
}

// skipAll leaves queues out of the background recount's comparison.
func (bg *background) skipAll(queues map[bson.ObjectID]bool) {
	if bg != nil {
		maps.Copy(bg.skip, queues)
	}
}

// advanced records what a batch added (deltas, less the queues res found
// missing or moved, which are skipped).
func (bg *background) advanced(deltas map[bson.ObjectID]*store.QueueCounts, res store.CountersAdvanced) {
	if bg == nil {
		return
	}
	for _, q := range res.Missing {
		bg.skip[q] = true
	}
	for q := range res.Moved {
		bg.skip[q] = true
	}
	for q, d := range deltas {
		if bg.skip[q] || *d == (store.QueueCounts{}) {
			continue // skipped, or not advanced (nothing to add)
		}
		c := bg.since[q]
		if c == nil {
			c = &store.QueueCounts{}
			bg.since[q] = c
		}
		*c = c.Plus(*d)
	}
}

// backgroundDone compares the background recount once it is back and no
// other recount is pending (a repair writes the checkpoint, which must not
// pass queues still to recount), and repairs what differs. A failure, of
// the recount or of its repair, is retried as a recount between batches
// is (Config.ReconcileEvery later, spaced by the backoff; a term's
// catch-up recount, due until one is compared, after the backoff alone);
// only the lease's loss ends the term. One compared reconciles the term.
func (p *projector) backgroundDone(ctx context.Context) error {
	bg := p.bg
	if bg == nil || (!bg.spoiled && (p.full || len(p.recount) > 0)) {
		return nil
	}
	var res backgroundResult
	select {
	case res = <-bg.done:
	default:
		return nil
	}
	p.bg = nil
	switch {
	case ctx.Err() != nil:
		return nil // the term ends
	case bg.spoiled:
		return nil
	case errors.Is(res.err, store.ErrSnapshotTooOld):
		// Idle for longer than the server keeps snapshots: between two
		// batches, which recounts at the present.
		p.full = true
		return nil
	case res.err != nil:
		p.backOff(p.recountName(), res.err)
		return nil
	}
	switch err := p.compareBackground(ctx, bg, res.rc); {
	case errors.Is(err, store.ErrLeaseLost) || ctx.Err() != nil:
		return err
	case err != nil:
		// Its read of the counters, or its sets' transaction (which
		// either wrote or did not: a queue it did write without this
		// term knowing is found moved, and recounted, by its next batch).
		p.backOff(p.recountName(), err)
	default:
		p.recounted()
		p.reconciled = true // started once caught up
		p.steady()
	}
	return nil
}

// recountName names the term's recount of every queue in the log: its
// catch-up recount until one is compared, then the periodic one.
func (p *projector) recountName() string {
	if !p.reconciled {
		return "catch-up recount"
	}
	return "periodic recount"
}

// compareBackground repairs the queues whose counters, less what the
// batches added since the recount's moment, differ from it: each is set to
// the recount plus those additions, at its own position (the recount's
// moment when no batch added to it since). Any difference is drift, as a
// recount's between batches is when no event went unknown.
func (p *projector) compareBackground(ctx context.Context, bg *background, rc store.Recount) error {
	stored, err := p.s.cfg.Store.QueueCounters(ctx)
	if err != nil {
		return err
	}
	sets := map[bson.ObjectID]store.QueueCounts{}
	positions := map[bson.ObjectID]store.CounterPosition{}
	drift := int64(0)
	for q, c := range rc.Counts {
		cur, ok := stored[q]
		if bg.skip[q] || !ok {
			continue
		}
		want, pos := c, store.CounterPosition{Time: bg.at}
		if s := bg.since[q]; s != nil {
			want = c.Plus(*s)
			pos = *p.applied[q] // the last batch that added to it
		}
		if !cur.Complete() {
			sets[q], positions[q] = want, pos
			p.logCreated(q, want)
			continue
		}
		if cur.Are(want) {
			continue
		}
		if !samePosition(cur.Applied, p.applied[q]) {
			// Another term moved them: not drift, and not this
			// comparison's to set. Marked and held as a batch that
			// found them moved would (a batch that adds nothing to the
			// queue never would): recounted between batches, fenced by
			// the lease.
			p.movedByAnother(q, cur.Applied)
			continue
		}
		sets[q], positions[q] = want, pos
		drift++
		p.s.log.Error("counter drift repaired", differs(q, cur, want)...)
	}
	return p.setRecounted(ctx, sets, positions, drift)
}

// samePosition reports whether two positions (nil: none said) are one.
func samePosition(a, b *store.CounterPosition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
