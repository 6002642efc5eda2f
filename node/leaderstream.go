package node

import (
	"context"
	"log/slog"
	"sync"

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

// leaderStreamStore opens the leader's change stream.
type leaderStreamStore interface {
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
}

// sharedStream is one leader's duty that opens the leader's change stream
// (store.StreamLeader, paced: its duties can wait 20 ms) and runs duties
// on it, each hearing every batch in order. Every stream reads every
// oplog entry, whatever it matches: one stream for the timers and the
// graphs instead of one each cost a one-node drain 30 µs of mongod CPU
// per task less (docs/scaling.md). It ends when every duty has ended;
// one ending with an error ends the others, and that error is returned.
func sharedStream(st leaderStreamStore, log *slog.Logger, duties ...streamDuty) leadership.Duty {
	return func(ctx context.Context, term leadership.Term) error {
		r, err := st.StreamOpen(ctx, store.StreamParams{Profile: store.StreamLeader, Name: "leader", Pace: store.Patient, Logger: log}) // paced in real time
		if err != nil {
			return err
		}
		defer r.Close()
		return teeRun(ctx, term, r, duties)
	}
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
	mu  sync.Mutex
	err error // why the stream ended, once ch is closed
}

func (f *feed) end(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
	close(f.ch)
}

// Next is the next batch, or the error that ended the stream.
func (f *feed) Next(ctx context.Context) (store.StreamBatch, error) {
	select {
	case b, ok := <-f.ch:
		if ok {
			return b, nil
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return store.StreamBatch{}, f.err
	case <-ctx.Done():
		return store.StreamBatch{}, ctx.Err()
	}
}
