package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// BenchmarkPickup measures pickup latency: from the start of a task's
// insert (write concern majority, one at a time at 50 tasks/s) to the moment
// its plugin starts, which is after the node's claim (-1) and running (0)
// writes were acknowledged. It runs change-stream mode and poll-only mode
// in the same run and reports percentiles in ms. Run with -benchtime 1x.
func BenchmarkPickup(b *testing.B) {
	const tasks, rate = 100, 50
	for _, pollOnly := range []bool{false, true} {
		name := "change-stream"
		if pollOnly {
			name = "poll-only"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				lat := measurePickup(b, pollOnly, tasks, rate)
				slices.Sort(lat)
				pct := func(p float64) float64 {
					return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
				}
				b.ReportMetric(pct(0.50), "p50-ms")
				b.ReportMetric(pct(0.95), "p95-ms")
				b.ReportMetric(pct(0.99), "p99-ms")
				b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
			}
		})
	}
}

func measurePickup(b *testing.B, pollOnly bool, tasks, rate int) []time.Duration {
	db := mongotest.Database(b)
	s := store.New(db, store.Options{})
	var mu sync.Mutex
	started := map[bson.ObjectID]time.Time{}
	all := make(chan struct{})
	reg := plugin.NewRegistry()
	reg.Register("noop", plugin.Func(func(_ context.Context, t plugin.Task) plugin.Result {
		mu.Lock()
		started[t.ID] = time.Now()
		if len(started) == tasks {
			close(all)
		}
		mu.Unlock()
		return plugin.Result{Status: schema.StatusSucceeded}
	}))
	four := 4
	q, err := s.QueueCreate(context.Background(), store.QueueCreateParams{Name: "bench", Constructor: "noop", MaxThreads: &four, Sort: schema.SortFIFO})
	if err != nil {
		b.Fatal(err)
	}
	n, err := New(Config{Name: "bench", Store: s, Plugins: reg, PollOnly: pollOnly, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer n.Stop()
	time.Sleep(200 * time.Millisecond)
	inserted := make(map[bson.ObjectID]time.Time, tasks)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for range tasks {
		<-tick.C
		id := bson.NewObjectID()
		t0 := time.Now()
		if _, err := s.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil}, IDs: []bson.ObjectID{id}}); err != nil {
			b.Fatal(err)
		}
		inserted[id] = t0
	}
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		b.Fatal("not every task started within 30 s")
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, tasks)
	for id, t0 := range inserted {
		lat = append(lat, started[id].Sub(t0))
	}
	if len(lat) != tasks {
		b.Fatal(fmt.Sprintf("%d of %d latencies", len(lat), tasks))
	}
	return lat
}
