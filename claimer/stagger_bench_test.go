package claimer

import (
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// BenchmarkStaggerBulkInsert: the wake-ups of a 1,000-task insert into a
// queue 50 other nodes serve, as one loop turn ranks them.
func BenchmarkStaggerBulkInsert(b *testing.B) {
	q := bson.NewObjectID()
	var peers []string
	for i := range 50 {
		peers = append(peers, fmt.Sprintf("node-%02d", i))
	}
	c := New(Config{Node: "node-me"})
	c.queues[q] = Queue{ID: q, Peers: peers}
	c.wakers = map[bson.ObjectID]wakers{q: listeners("node-me", c.queues[q], c.cfg.Listeners)} // as a read sets them
	c.dirty = map[bson.ObjectID]bool{}
	tasks := make([]newTask, 1000)
	for i := range tasks {
		tasks[i] = newTask{task: bson.NewObjectID(), queue: q}
	}
	b.ResetTimer()
	for range b.N {
		c.newTasks = append(c.newTasks[:0], tasks...)
		c.stagger()
		clear(c.due)
	}
}
