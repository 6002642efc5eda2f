package node

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// signalStore is what the signals listener reads.
type signalStore interface {
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
	TaskKillsPending(ctx context.Context, node string) ([]store.TaskKillRequest, error)
}

// killRequests carries out operators' kill requests for the tasks this node
// holds. It follows the node's StreamSignals change stream, so a request
// reaches the plugin milliseconds after it is committed; every tick it
// also reads the pending requests (a change event missed while the stream
// was resuming, or a request older than this run), the safety net.
type killRequests struct {
	lifecycle.Base
	node  string
	store signalStore
	// kill kills a held task (see runner.kill); it reports whether the
	// node holds it.
	kill func(id bson.ObjectID, cause error) bool
	tick time.Duration
	// pollOnly: no change stream, the sweep alone (a node without change
	// streams).
	pollOnly bool
	clock    clock.Clock
	log      *slog.Logger
	// handled, when set, is called after each kill carried out (a test
	// signal).
	handled func(id bson.ObjectID)
}

// Start opens the stream before it returns (every request committed after
// Start is heard), then listens and sweeps until Stop.
func (s *killRequests) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		run.Every(s.clock, s.tick, s.sweep)
		if s.pollOnly {
			return nil
		}
		r, err := s.store.StreamOpen(ctx, store.StreamParams{Profile: store.StreamSignals, Node: s.node, Name: "signals:" + s.node,
			Clock: s.clock, Logger: s.log})
		if err != nil {
			return err
		}
		run.Cleanup(r.Close)
		run.Go(func(ctx context.Context) { s.listen(ctx, r) })
		return nil
	})
}

func (s *killRequests) listen(ctx context.Context, r *store.StreamReader) {
	for {
		b, err := r.Next(ctx)
		if err != nil {
			return // ctx ended
		}
		if b.Lost != "" {
			s.sweep(ctx)
		}
		for _, ev := range b.Events {
			if ev.Coll != schema.CollTasks || ev.Doc == nil {
				continue
			}
			if k, ok := store.KillRequestOf(ev.Doc); ok {
				k.ID, _ = ev.ID.ObjectIDOK()
				s.carryOut(k, "change stream")
			}
		}
	}
}

// sweep carries out the pending requests.
func (s *killRequests) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ks, err := s.store.TaskKillsPending(ctx, s.node)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug("read pending kill requests", "error", err)
		}
		return
	}
	for _, k := range ks {
		s.carryOut(k, "sweep")
	}
}

func (s *killRequests) carryOut(k store.TaskKillRequest, via string) {
	if k.Request.Node != s.node || (k.Status != schema.StatusClaimed && k.Status != schema.StatusRunning) {
		return
	}
	if s.kill(k.ID, killRequested(k.Request)) {
		s.log.Debug("kill request carried out", "task_id", k.ID.Hex(), "by", k.Request.By, "via", via)
		if s.handled != nil {
			s.handled(k.ID)
		}
	}
}
