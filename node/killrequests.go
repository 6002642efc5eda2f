package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/store"
)

// killStore is what the kill-request listener reads.
type killStore interface {
	TaskKillsPending(ctx context.Context, node string) ([]store.TaskKillRequest, error)
}

// killRequests carries out operators' kill requests for the tasks this node
// holds. It hears them on the node's bus (events.TopicKills, from the one
// wake-up change stream the node follows), so a request reaches the plugin
// milliseconds after it is committed; every tick it also reads the pending
// requests (an event missed while the stream was resuming, or a request
// older than this run), the safety net, and it reads them at once when
// the stream says it delivered not everything (a Rescan).
type killRequests struct {
	lifecycle.Base
	node  string
	store killStore
	// events is the node's bus; nil when the node polls only (the sweep
	// alone then).
	events message.Subscriber
	// kill kills a held task (see runner.kill); it reports whether the
	// node holds it.
	kill func(id bson.ObjectID, cause error) bool
	tick time.Duration
	// pollOnly: no change stream, the sweep alone (a node without change
	// streams).
	pollOnly bool
	// quiet, when set, says the wake-up stream is let go
	// (events.Stream.Quiet): no request is heard meanwhile, so the sweep
	// runs every claimer.QuietAfter instead of every tick while the node
	// holds a task (holding), there being nothing to kill otherwise: a
	// node that is no queue's listener (claimer.Config.Listeners) lets
	// its stream go idle too.
	quiet   func() bool
	holding func() bool
	clock   clock.Clock
	log     *slog.Logger
	// handled, when set, is called after each kill carried out (a test
	// signal).
	handled func(id bson.ObjectID)
}

// Start subscribes before it returns, then listens and sweeps until Stop.
func (s *killRequests) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		if s.quiet == nil || s.tick <= claimer.QuietAfter {
			run.Every(s.clock, s.tick, s.sweep)
		} else {
			var last time.Time
			run.Every(s.clock, claimer.QuietAfter, func(ctx context.Context) {
				if (s.quiet() && s.holding()) || s.clock.Since(last) >= s.tick {
					last = s.clock.Now()
					s.sweep(ctx)
				}
			})
		}
		if s.events == nil {
			return nil
		}
		if err := events.Listen(run.Context(), s.events, events.TopicKills, run.Go, s.heard); err != nil {
			return err
		}
		due := make(chan struct{}, 1)
		if err := events.Listen(run.Context(), s.events, events.TopicRescan, run.Go, func(ev any, err error) { rescanned(ev, err, due) }); err != nil {
			return err
		}
		run.Go(func(ctx context.Context) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-due:
					s.sweep(ctx)
				}
			}
		})
		return nil
	})
}

// rescanned asks for a sweep (on due) at every Rescan: the stream did not
// deliver everything since its last event (history lost, or a quiet spell
// it reopened from at the present), and a request made in that gap, after
// the last sweep, would otherwise wait for the next one, a tick away. The
// sweep runs apart: the bus waits for this acknowledgement.
func rescanned(ev any, err error, due chan<- struct{}) {
	if _, ok := ev.(events.Rescan); ok && err == nil {
		select {
		case due <- struct{}{}:
		default: // one is due already
		}
	}
}

// heard carries out a kill request from the change stream.
func (s *killRequests) heard(ev any, err error) {
	if k, ok := ev.(events.KillRequested); ok && err == nil {
		s.carryOut(store.TaskKillRequest{ID: k.ID, Request: k.Request}, "change stream")
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
	// The runner acts only on a task it holds (claimed or running), so a
	// request on a task that has ended since is ignored there.
	if k.Request.Node != s.node {
		return
	}
	if s.kill(k.ID, killRequested(k.Request)) {
		s.log.Debug("kill request carried out", "task_id", k.ID.Hex(), "by", k.Request.By, "via", via)
		if s.handled != nil {
			s.handled(k.ID)
		}
	}
}
