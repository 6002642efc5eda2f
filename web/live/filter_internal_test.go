package live

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestAQueuesSubscriberHearsTaskEventsOfAnUnknownQueue: a task event whose
// queue is unknown (another program's update, before the hub asks for
// pre-images) reaches a queue's subscribers; one of another queue does
// not.
func TestAQueuesSubscriberHearsTaskEventsOfAnUnknownQueue(t *testing.T) {
	t.Parallel()
	mine, other := bson.NewObjectID(), bson.NewObjectID()
	f := filter{kinds: kindsAll, queues: map[bson.ObjectID]bool{mine: true}}
	for _, tc := range []struct {
		what string
		it   item
		want bool
	}{
		{"its queue", item{kind: kindTask, queue: mine, hasQueue: true}, true},
		{"moved from its queue", item{kind: kindTask, queue: other, hasQueue: true, from: mine, hasFrom: true}, true},
		{"another queue", item{kind: kindTask, queue: other, hasQueue: true}, false},
		{"an unknown queue", item{kind: kindTask}, true},
		{"another queue's own change", item{kind: kindQueue, queue: other, hasQueue: true}, false},
	} {
		require.Equal(t, tc.want, f.match(&tc.it), tc.what)
	}
	tasks := filter{kinds: kindsAll, tasks: map[bson.ObjectID]bool{mine: true}, queues: map[bson.ObjectID]bool{mine: true}}
	require.False(t, tasks.match(&item{kind: kindTask, task: other, hasTask: true}), "a task filter still applies")
}
