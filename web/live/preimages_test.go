package live_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/web/live"
)

// TestStreamsAskForPreImagesOnlyWhileTasksKeepThem: the hub follows the
// tasks collection's pre-images as the projector turns them on and off,
// reopening its stream where it was (nothing lost or repeated); while they
// are off our writes still say where their task stood (TaskPrior), another
// program's update has no from-status; once they are on again it has.
func TestStreamsAskForPreImagesOnlyWhileTasksKeepThem(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // pre-images on
	s := f.serve(live.Options{PreImagesCheck: 50 * time.Millisecond})
	require.True(t, s.hub.Stats().PreImages, "kept at the start: asked for")
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

	require.NoError(t, f.st.TasksPreImagesSet(ctxT(t), false))
	eventually(t, func() bool { return !s.hub.Stats().PreImages }, wait, "the hub stops asking for pre-images")
	for _, w := range f.run(q.ID, "n1") {
		c.requireTask(w) // from-status and queue from the writes themselves
	}
	raw(ids[1], schema.StatusFailed)
	require.Nil(t, from(), "another program's update, pre-images off: no from-status")

	require.NoError(t, f.st.TasksPreImagesSet(ctxT(t), true))
	eventually(t, func() bool { return s.hub.Stats().PreImages }, wait, "the hub asks for pre-images again")
	raw(ids[1], schema.StatusSucceeded)
	require.Equal(t, st(schema.StatusFailed), from(), "another program's update, pre-images on")
	c.quiet(300 * time.Millisecond)
}
