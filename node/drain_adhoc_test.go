package node

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func BenchmarkAdhocDrain(b *testing.B) {
	for _, batch := range []int{1, 64} {
		b.Run(map[int]string{1: "single", 64: "batch64"}[batch], func(b *testing.B) {
			db := mongotest.Database(b)
			s := store.New(db, store.Options{})
			const N = 20000
			var done atomic.Int64
			fin := make(chan struct{})
			reg := plugin.NewRegistry()
			reg.Register("noop", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
				if done.Add(1) == N {
					close(fin)
				}
				return plugin.Result{Status: schema.StatusSucceeded}
			}))
			mt := 64
			q, _ := s.QueueCreate(context.Background(), store.QueueCreateParams{Name: "q", Constructor: "noop", MaxThreads: &mt, Sort: schema.SortFIFO})
			ps := make([]bson.Raw, 1000)
			for i := 0; i < N; i += 1000 {
				if _, err := s.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q.ID, Parameters: ps}); err != nil {
					b.Fatal(err)
				}
			}
			n, _ := New(Config{Name: "n", Store: s, Plugins: reg, ClaimBatch: batch, Logger: slog.New(slog.DiscardHandler)})
			start := time.Now()
			if err := n.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			<-fin
			el := time.Since(start)
			n.Stop()
			b.ReportMetric(float64(N)/el.Seconds(), "tasks/s")
		})
	}
}
