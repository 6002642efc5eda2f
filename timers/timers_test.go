package timers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// passStore counts the passes; the first fails (no primary).
type passStore struct{ passes atomic.Int64 }

func (s *passStore) TaskTimerNext(context.Context) (time.Time, bool, error) {
	return time.Time{}, false, nil
}

func (s *passStore) TaskExpireDue(context.Context, store.TaskTimersParams) (map[bson.ObjectID]int64, error) {
	return nil, nil
}

func (s *passStore) TaskReleaseDue(context.Context, store.TaskTimersParams) (int64, error) {
	if s.passes.Add(1) == 1 {
		return 0, errors.New("test: not primary")
	}
	return 0, nil
}

func (s *passStore) ServerNow(context.Context) (time.Time, error) { return time.Now(), nil }

// skewedStore's server clock is an hour ahead of the leader's; its next
// timer is 200 ms after the first pass, by the server's clock. It records
// the moments the passes judged by.
type skewedStore struct {
	first  atomic.Pointer[time.Time]
	passes atomic.Int32
	judged chan time.Time
}

func (s *skewedStore) ServerNow(context.Context) (time.Time, error) {
	return time.Now().Add(time.Hour), nil
}

func (s *skewedStore) TaskTimerNext(context.Context) (time.Time, bool, error) {
	// One timer, 200 ms after the first pass by the server's clock, until
	// a second pass has judged it (not by when this is asked: a loaded
	// machine may ask late).
	if f := s.first.Load(); f != nil && s.passes.Load() < 2 {
		return f.Add(200 * time.Millisecond), true, nil
	}
	return time.Time{}, false, nil
}

func (s *skewedStore) TaskExpireDue(context.Context, store.TaskTimersParams) (map[bson.ObjectID]int64, error) {
	return nil, nil
}

func (s *skewedStore) TaskReleaseDue(_ context.Context, p store.TaskTimersParams) (int64, error) {
	s.first.CompareAndSwap(nil, &p.Now)
	s.passes.Add(1)
	select {
	case s.judged <- p.Now:
	default:
	}
	return 0, nil
}

// quiet is a stream with nothing to say.
type quiet struct{}

func (quiet) Next(ctx context.Context) (store.StreamBatch, error) {
	<-ctx.Done()
	return store.StreamBatch{}, ctx.Err()
}

// TestTimersJudgeByTheServersClock: what is due is judged by the server's
// clock (a leader whose clock runs behind would expire tasks late, one
// ahead early, for good), and a time read from the tasks is waited for on
// the leader's clock less the difference: the pass 200 ms later by the
// server's clock comes about 200 ms later, neither an hour off nor at once
// over and over.
func TestTimersJudgeByTheServersClock(t *testing.T) {
	t.Parallel()
	st := &skewedStore{judged: make(chan time.Time, 100)}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.NoError(t, New(Config{Store: st, Tick: time.Minute}).Lead(ctx, leadership.Term{}, quiet{}))
	var judged []time.Time
	for len(st.judged) > 0 {
		judged = append(judged, <-st.judged)
	}
	require.Len(t, judged, 2, "the first pass and the one at the next timer, no more: %v", judged)
	require.WithinDuration(t, start.Add(time.Hour), judged[0], time.Second, "judged by the server's clock")
	// Not before the timer, and not an hour late; a loaded machine may
	// wake the pass late, but not by a second.
	took := judged[1].Sub(judged[0])
	require.GreaterOrEqual(t, took, 199*time.Millisecond, "the next timer's pass came before it")
	require.Less(t, took, 1200*time.Millisecond, "the next timer's pass, on time")
}

// hinting is a stream whose every batch, every 10 ms, names a time an
// hour out (tasks inserted with expires_at an hour away, say).
type hinting struct{}

func (hinting) Next(ctx context.Context) (store.StreamBatch, error) {
	select {
	case <-ctx.Done():
		return store.StreamBatch{}, ctx.Err()
	case <-time.After(10 * time.Millisecond):
	}
	doc, err := bson.Marshal(bson.D{{Key: schema.TaskExpiresAt, Value: time.Now().Add(time.Hour)}})
	if err != nil {
		return store.StreamBatch{}, err
	}
	return store.StreamBatch{Events: []store.ChangeEvent{{Doc: doc}}}, nil
}

// TestHintsDoNotPutOffTheSafetyNet: the pass a Tick after the last comes
// however often the stream hints at later times; here the first pass
// failed (it knows no next time), and hints an hour out come every 10 ms.
func TestHintsDoNotPutOffTheSafetyNet(t *testing.T) {
	t.Parallel()
	st := &passStore{}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	require.NoError(t, New(Config{Store: st, Tick: 100 * time.Millisecond}).Lead(ctx, leadership.Term{}, hinting{}))
	require.GreaterOrEqual(t, st.passes.Load(), int64(8), "passes in 1.5 s with a tick of 100 ms")
}
