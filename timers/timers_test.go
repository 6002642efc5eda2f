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
