package live_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/live"
)

// asking is the real store, noting whether each of the hub's own streams
// ("live") was opened asking for pre-images.
type asking struct {
	*store.Store
	mu    sync.Mutex
	asked []bool
}

func (a *asking) StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error) {
	if p.Name == "live" {
		a.mu.Lock()
		a.asked = append(a.asked, !p.NoPreImages)
		a.mu.Unlock()
	}
	return a.Store.StreamOpen(ctx, p)
}

func (a *asking) opens() []bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]bool(nil), a.asked...)
}

// TestStreamsAskForPreImagesOnlyWhileTasksKeepThem: the hub follows the
// tasks collection's pre-images as the projector turns them on and off,
// reopening its stream, asking for them or not, where it was: tasks
// inserted before, while and after it reopens arrive once each, in order.
// While they are off our writes still say where their task stood
// (TaskPrior) and another program's update has no from-status; once they
// are on again (and asked for) it has one.
func TestStreamsAskForPreImagesOnlyWhileTasksKeepThem(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // pre-images on
	rec := &asking{Store: f.st}
	s := f.serve(live.Options{Store: rec, PreImagesCheck: 50 * time.Millisecond})
	require.Equal(t, []bool{true}, rec.opens(), "kept at the start: asked for")
	require.True(t, s.hub.Stats().PreImages)
	c := s.connect(t, "", "")
	c.nextFrame(wait) // the retry hint
	q := f.queue("q")
	c.next()
	ids := f.insert(q.ID, 3)
	for _, id := range ids {
		c.requireTask(inserted(id, q.ID))
	}
	raw := func(id bson.ObjectID, status schema.Status) {
		t.Helper()
		_, err := f.db.Collection(schema.CollTasks, majority).UpdateOne(ctxT(t), bson.D{{Key: "_id", Value: id}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskStatus, Value: int32(status)}}}})
		require.NoError(t, err)
	}
	from := func() *int {
		t.Helper()
		return decode[taskEv](t, c.next(), "task").From
	}
	// switch sets pre-images and inserts tasks one by one until the hub
	// has reopened its stream, and a few after; each arrives once.
	switchTo := func(on bool, opens int) {
		t.Helper()
		require.NoError(t, f.st.TasksPreImagesSet(ctxT(t), on))
		var during []bson.ObjectID
		deadline := time.Now().Add(wait)
		for len(rec.opens()) < opens {
			require.True(t, time.Now().Before(deadline), "the hub did not reopen its stream")
			during = append(during, f.insert(q.ID, 1)...)
			time.Sleep(5 * time.Millisecond)
		}
		during = append(during, f.insert(q.ID, 3)...)
		require.Equal(t, on, rec.opens()[opens-1], "reopened asking for pre-images: %v", on)
		require.Equal(t, on, s.hub.Stats().PreImages)
		for _, id := range during {
			c.requireTask(inserted(id, q.ID))
		}
	}

	switchTo(false, 2)
	for _, w := range f.run(q.ID, "n1") { // ids[0], the oldest
		c.requireTask(w) // from-status and queue from the writes themselves
	}
	raw(ids[1], schema.StatusFailed)
	require.Nil(t, from(), "another program's update, pre-images off: no from-status")

	switchTo(true, 3)
	raw(ids[1], schema.StatusSucceeded)
	require.Equal(t, st(schema.StatusFailed), from(), "another program's update, pre-images on and asked for")
	c.quiet(300 * time.Millisecond)
}
