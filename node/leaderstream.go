package node

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

// batchSource is a change stream as its readers see it.
type batchSource interface {
	Next(ctx context.Context) (store.StreamBatch, error)
}

// streamDuty is a leader's duty that follows the leader's change stream:
// it reads src from one goroutine until ctx ends.
type streamDuty func(ctx context.Context, term leadership.Term, src batchSource) error

// leaderStreamStore opens the leader's change stream, and says whether a
// task waits on its parents.
type leaderStreamStore interface {
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
	TaskGraphAnyWaiting(ctx context.Context) (bool, error)
}

// endsCheckEvery is how often a leader reading the tasks' ends asks
// whether any task still waits on its parents (then it reads without).
const endsCheckEvery = time.Minute

// sharedStream is one leader's duty that opens the leader's change stream
// (store.StreamLeader, paced: its duties can wait 20 ms) and runs duties
// on it, each hearing every batch in order. Every stream reads every
// oplog entry, whatever it matches: one stream for the timers and the
// graphs instead of one each saved 6 µs of mongod CPU per task in a
// one-node drain, 16 µs with three nodes (docs/scaling.md). It ends when
// every duty has ended;
// one ending with an error ends the others, and that error is returned.
//
// With a ride (nil: none), the duties follow the projector's stream
// instead while this node's projector leads (see ride).
func sharedStream(st leaderStreamStore, log *slog.Logger, rd *ride, duties ...streamDuty) leadership.Duty {
	return func(ctx context.Context, term leadership.Term) error {
		src := &leaderSource{st: st, log: log, ends: true, ride: rd}
		if off, ok := src.join(ctx); ok {
			src.off = off
		} else if err := src.open(ctx, store.Position{}); err != nil {
			return err
		}
		defer src.close()
		return teeRun(ctx, term, src, duties)
	}
}

// leaderSource is the leader's change stream, read with the tasks' ends
// (store.StreamParams.GraphEnds) only while a task may wait on its
// parents: every finish is an end, and carrying them cost a one-node
// drain about 25 µs of mongod CPU per task (8%). It starts with them; at its
// first batch, and every endsCheckEvery after, it asks whether any task
// waits, and if none does it goes on from that batch without them. A task
// that starts waiting later is an event of the stream either way
// (store.WaitsOnParents), and from that event on it reads the ends
// again. A parent that ended before its child was inserted is the
// insert's to settle (store.TaskInsertGraph). Read from one goroutine.
type leaderSource struct {
	st      leaderStreamStore
	log     *slog.Logger
	r       *store.StreamReader
	ends    bool
	checked time.Time // when ends were last found needed (real time)
	// want: reopen with the ends from resume (zero: now), as soon as
	// a reopen succeeds.
	want   bool
	resume bson.Raw
	// ride: the projector's stream, followed instead of r while off is
	// not nil (nil: never); taken: its batches taken, not yet returned.
	ride  *ride
	off   <-chan struct{}
	taken []store.StreamBatch
}

// join follows the projector's stream if it is up (a Lost comes first:
// what the duties missed is re-read), with the ends if a task waits on
// its parents.
func (l *leaderSource) join(ctx context.Context) (<-chan struct{}, bool) {
	if l.ride == nil {
		return nil, false
	}
	off, ok := l.ride.join()
	if ok {
		l.log.Debug("leader stream: following the projector's stream")
		l.ends, l.want, l.resume, l.taken = true, false, nil, nil
		l.checkEnds(ctx)
	}
	return off, ok
}

// endsNeeded asks whether a task waits on its parents (true when the
// answer is unknown). Events from the moment of the question on tell
// when one starts to (WaitsOnParents).
func (l *leaderSource) endsNeeded(ctx context.Context) bool {
	l.checked = time.Now()
	waiting, err := l.st.TaskGraphAnyWaiting(ctx)
	return err != nil || waiting
}

// checkEnds keeps the ends of the projector's stream only if they are
// needed (endsNeeded).
func (l *leaderSource) checkEnds(ctx context.Context) {
	was := l.ends
	l.ends = l.endsNeeded(ctx)
	if was && !l.ends {
		l.log.Debug("leader stream: no task waits on its parents, so the tasks' ends are left out until one does")
	}
}

// close ends the reading of either stream.
func (l *leaderSource) close() {
	if l.r != nil {
		l.r.Close()
		l.r = nil
	}
	if l.off != nil {
		l.ride.leave()
		l.off, l.taken = nil, nil
	}
}

// switched is the batch that says the duties now follow another stream:
// they re-read what they might have missed between the two.
func switched(to string) store.StreamBatch {
	return store.StreamBatch{Lost: "the leader's duties now follow " + to}
}

// openOwn opens a stream of its own at the present once the projector's
// has ended, retrying until ctx ends: mid-term nothing else would (the
// duties do not end with their stream).
func (l *leaderSource) openOwn(ctx context.Context) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 5*time.Second, 0
	for {
		err := l.open(ctx, store.Position{})
		if err == nil || ctx.Err() != nil {
			return err
		}
		wait := b.NextBackOff()
		l.log.Warn("leader stream: cannot open a stream of its own; retrying", "in", wait, "error", err)
		t := time.NewTimer(wait) // real time, as the stream's pace
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// open replaces the reader by one from `from` (zero: now) with or
// without the ends as l.ends says; on failure the old one stays.
func (l *leaderSource) open(ctx context.Context, from store.Position) error {
	r, err := l.st.StreamOpen(ctx, store.StreamParams{Profile: store.StreamLeader, GraphEnds: l.ends, From: from,
		Name: "leader", Pace: store.Patient, Logger: l.log}) // paced in real time
	if err != nil {
		return err
	}
	if l.r != nil {
		l.r.Close()
	}
	l.r = r
	return nil
}

// Next is the next batch of the stream followed: the projector's while
// it is up (switching to it between batches of its own, which come at
// least every MaxAwait), else its own. Between batches it switches the
// ends on or off.
func (l *leaderSource) Next(ctx context.Context) (store.StreamBatch, error) {
	if l.off != nil {
		return l.nextRiding(ctx)
	}
	if off, ok := l.join(ctx); ok {
		l.r.Close()
		l.r, l.off = nil, off
		return switched("the projector's stream"), nil
	}
	b, err := l.r.Next(ctx)
	if err != nil {
		return b, err
	}
	switch {
	case !l.ends && !l.want:
		for _, ev := range b.Events {
			if store.WaitsOnParents(ev) {
				l.want, l.resume = true, ev.Token // what follows it, with the ends
				break
			}
		}
		if b.Lost != "" && !l.want {
			l.want, l.resume = true, b.Token // unknown changes: read the ends until a check
		}
	case l.ends && time.Since(l.checked) >= endsCheckEvery:
		if l.endsNeeded(ctx) {
			break
		}
		l.ends = false
		if err := l.open(ctx, store.Position{Token: b.Token}); err != nil {
			l.ends = true
			break
		}
		l.log.Debug("leader stream: no task waits on its parents, so the tasks' ends are left out until one does")
	}
	if l.want {
		l.ends = true
		if err := l.open(ctx, store.Position{Token: l.resume}); err != nil {
			l.ends = false // the next batch tries again, from the same place
			return b, nil
		}
		l.want, l.resume, l.checked = false, nil, time.Now()
		l.log.Debug("leader stream: a task waits on its parents, so the tasks' ends are read again")
	}
	return b, nil
}

// nextRiding is the next batch of the projector's stream, only the
// leader's events in it (store.LeaderMatch: the ends while a task may
// wait on its parents, as the stream of its own would carry them). When
// that stream ends it opens its own at the present.
func (l *leaderSource) nextRiding(ctx context.Context) (store.StreamBatch, error) {
	for len(l.taken) == 0 {
		select {
		case <-ctx.Done():
			return store.StreamBatch{}, ctx.Err()
		case <-l.off:
			l.ride.leave()
			l.off, l.taken = nil, nil
			l.ends, l.want, l.resume = true, false, nil
			if err := l.openOwn(ctx); err != nil {
				return store.StreamBatch{}, err
			}
			l.checked = time.Time{} // ask at the first batch whether the ends are needed
			l.log.Debug("leader stream: the projector's stream ended; following one of its own")
			return switched("a stream of their own"), nil
		case <-l.ride.ready:
			l.taken = l.ride.take()
		}
	}
	b := l.taken[0]
	l.taken = l.taken[1:]
	if b.Lost != "" {
		l.ends = true // a task that started waiting may be among what was missed
		l.checkEnds(ctx)
		return b, nil
	}
	kept := b
	kept.Events = nil
	for _, ev := range b.Events {
		if !l.ends && store.WaitsOnParents(ev) {
			l.ends, l.checked = true, time.Now()
			l.log.Debug("leader stream: a task waits on its parents, so the tasks' ends are read again")
		}
		if store.LeaderMatch(ev, l.ends) {
			kept.Events = append(kept.Events, ev)
		}
	}
	if l.ends && time.Since(l.checked) >= endsCheckEvery {
		l.checkEnds(ctx)
	}
	return kept, nil
}

// teeRun runs duties, each on its own copy of src's batches, until every
// duty has returned; src is read from one goroutine, which it has ended
// by the time teeRun returns.
func teeRun(ctx context.Context, term leadership.Term, src batchSource, duties []streamDuty) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	feeds := make([]*feed, len(duties))
	for i := range feeds {
		// A few batches of slack: a slow settle of the graphs does not
		// hold the timers' next batch back.
		feeds[i] = &feed{ch: make(chan store.StreamBatch, 8)}
	}
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		var err error
		defer func() {
			for _, f := range feeds {
				f.end(err)
			}
		}()
		for {
			var b store.StreamBatch
			b, err = src.Next(ctx)
			if err != nil {
				return
			}
			for _, f := range feeds {
				select {
				case f.ch <- b:
				case <-ctx.Done():
					err = ctx.Err()
					return
				}
			}
		}
	}()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i, d := range duties {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d(ctx, term, feeds[i]); err != nil {
				once.Do(func() { first = err })
			}
			cancel() // one ended: end the others
		}()
	}
	wg.Wait()
	cancel()
	<-pumped
	return first
}

// feed is one duty's copy of the stream.
type feed struct {
	ch  chan store.StreamBatch
	err error // why the stream ended: written before ch is closed, read after
}

func (f *feed) end(err error) {
	f.err = err
	close(f.ch)
}

// Next is the next batch, or the error that ended the stream.
func (f *feed) Next(ctx context.Context) (store.StreamBatch, error) {
	select {
	case b, ok := <-f.ch:
		if ok {
			return b, nil
		}
		return store.StreamBatch{}, f.err
	case <-ctx.Done():
		return store.StreamBatch{}, ctx.Err()
	}
}
