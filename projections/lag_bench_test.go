package projections_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// BenchmarkProjectionLag runs one node with a no-op plugin while a
// submitter inserts 250 tasks/s for 10 s: with claim, running and
// completion that is about 1,000 task transitions per second. It reports
// the projector's lag (event wall time to the commit of its batch) and
// that the counters equal a recount afterwards. Run with -benchtime 1x.
func BenchmarkProjectionLag(b *testing.B) {
	for range b.N {
		ctx := context.Background()
		db := mongotest.Database(b)
		s := store.New(db, store.Options{})
		reg := plugin.NewRegistry()
		reg.Register("noop", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
			return plugin.Result{Status: schema.StatusSucceeded}
		}))
		sixteen := 16
		q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "q", Constructor: "noop", MaxThreads: &sixteen})
		if err != nil {
			b.Fatal(err)
		}
		n, err := node.New(node.Config{Name: "n1", Store: s, Plugins: reg, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.Start(ctx); err != nil {
			b.Fatal(err)
		}
		const rate, seconds = 250, 10
		tick := time.NewTicker(time.Second / 25) // batches of 10, 25 times a second
		for i := 0; i < rate*seconds; i += 10 {
			<-tick.C
			if _, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: make([]bson.Raw, 10)}); err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		deadline := time.Now().Add(60 * time.Second)
		for {
			stored, err := s.QueueCounters(ctx)
			if err != nil {
				b.Fatal(err)
			}
			counts, err := s.QueueCountsGet(ctx)
			if err != nil {
				b.Fatal(err)
			}
			c := stored[q.ID]
			want := counts[q.ID]
			if c.Complete() && *c.Todo == want.Todo && *c.Total == want.Total && *c.Running == want.Running && *c.Failed == want.Failed && want.Todo == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("counters never settled: %v/%v/%v/%v vs %+v", c.Todo, c.Total, c.Running, c.Failed, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
		st := n.ProjectorStats()
		n.Stop()
		if st.DriftQueues != 0 {
			b.Fatalf("drift in %d queues", st.DriftQueues)
		}
		b.ReportMetric(float64(st.LagP50.Microseconds())/1000, "lag-p50-ms")
		b.ReportMetric(float64(st.LagP99.Microseconds())/1000, "lag-p99-ms")
		b.ReportMetric(float64(st.Events)/seconds, "events/s")
		b.ReportMetric(float64(st.Events)/float64(max(1, st.Batches)), "events/batch")
	}
}
