package continuous

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// fakeStore is the duty's store: queues, a server clock, and the
// creations asked of it.
type fakeStore struct {
	queues    []schema.Queue
	server    time.Time
	serverErr error
	created   []bson.ObjectID
	at        []time.Time
}

func (f *fakeStore) QueueList(context.Context) (store.QueueListResult, error) {
	return store.QueueListResult{Queues: f.queues}, nil
}

func (f *fakeStore) ServerNow(context.Context) (time.Time, error) { return f.server, f.serverErr }

func (f *fakeStore) ContinuousCreate(_ context.Context, q bson.ObjectID, _ time.Duration, now time.Time) (bson.ObjectID, bool, error) {
	f.created, f.at = append(f.created, q), append(f.at, now)
	return bson.NewObjectID(), true, nil
}

func continuousQueue(next time.Time) schema.Queue {
	return schema.Queue{ID: bson.NewObjectID(), Name: "c", Sched: schema.QueueSched{Continuous: true, Interval: time.Minute, NextContinuous: next}}
}

// TestPassJudgesDueByTheServersClock: a queue is due by the server's
// clock, whichever way the leader's is off, and is created at the
// server's moment.
func TestPassJudgesDueByTheServersClock(t *testing.T) {
	server := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		leader time.Duration // the leader's clock, against the server's
	}{{"leader behind", -time.Hour}, {"leader ahead", time.Hour}} {
		t.Run(c.name, func(t *testing.T) {
			due, notYet := continuousQueue(server.Add(-time.Second)), continuousQueue(server.Add(10*time.Minute))
			paused := continuousQueue(time.Time{})
			paused.Sched.Paused = true
			never := continuousQueue(time.Time{})
			st := &fakeStore{queues: []schema.Queue{due, notYet, paused, never, {ID: bson.NewObjectID(), Name: "plain"}}, server: server}
			New(Config{Store: st, Clock: clock.NewFake(server.Add(c.leader))}).Pass(context.Background())
			require.Equal(t, []bson.ObjectID{due.ID, never.ID}, st.created)
			require.Equal(t, []time.Time{server, server}, st.at)
		})
	}
}

// TestPassWithoutTheServersClockCreatesNothing: no creation is judged by
// the leader's own clock when the server's cannot be read.
func TestPassWithoutTheServersClockCreatesNothing(t *testing.T) {
	st := &fakeStore{queues: []schema.Queue{continuousQueue(time.Time{})}, serverErr: errors.New("no primary")}
	New(Config{Store: st}).Pass(context.Background())
	require.Empty(t, st.created)
}
