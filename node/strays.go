package node

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/store"
)

// strayAge is how old a claim must be before the node may decide it never
// received it: older than any claim whose answer could still arrive.
const (
	strayAge   = claimer.ClaimTimeout + 5*time.Second
	strayEvery = 5 * time.Second
	strayPage  = 1000 // ids a sweep reads at most
)

// strayStore finds and hands back claims.
type strayStore interface {
	TaskListClaimed(ctx context.Context, p store.TaskListClaimedParams) ([]bson.ObjectID, error)
	TaskRelease(ctx context.Context, p store.TaskTransitionParams) error
	TaskUnstart(ctx context.Context, p store.TaskTransitionParams) error
}

// strays hands back, every strayEvery, tasks claimed (-1) by this node that
// it never received: the server applied the claim, but its answer was lost
// (a failover interrupted it, the connection broke), so the claimer counted
// it as failed. Without this they would wait for the 5-minute orphan rule
// and then never run. They never started, so the queue gets them back.
type strays struct {
	lifecycle.Base
	node  string
	store strayStore
	// holds: the node received it from a claim and holds it, or started it
	// and could not write its result (runner.keeps).
	holds func(bson.ObjectID) bool
	// claimRunning: the node claims into running (Config.ClaimRunning),
	// so lost claims may also be in status 0.
	claimRunning bool
	fenced       func() bool // a fenced node writes nothing
	clock        clock.Clock
	log          *slog.Logger
	// after is where each sweep (by running) goes on from: a node may
	// hold more tasks than one read lists, and the first ones are the
	// same each time, so the sweeps page through them.
	after [2]bson.ObjectID
}

// Start sweeps every strayEvery until Stop.
func (s *strays) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(_ context.Context, run *lifecycle.Run) error {
		run.Every(s.clock, strayEvery, s.release)
		return nil
	})
}

func (s *strays) release(ctx context.Context) {
	if s.fenced() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s.sweep(ctx, false, s.store.TaskRelease)
	if s.claimRunning {
		// Claimed straight into running, answer lost: never started
		// either (a task this run started is one it holds).
		s.sweep(ctx, true, s.store.TaskUnstart)
	}
}

// sweep hands back, with handBack, this node's tasks in status -1 (or 0
// with running) older than strayAge that it does not hold.
func (s *strays) sweep(ctx context.Context, running bool, handBack func(context.Context, store.TaskTransitionParams) error) {
	page := &s.after[0]
	if running {
		page = &s.after[1]
	}
	ids, err := s.store.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: s.node, Running: running, ClaimedFor: strayAge, Limit: strayPage, After: *page})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug("look for stray claims", "running", running, "error", err)
		}
		return
	}
	*page = bson.ObjectID{} // from the first again, once at the end
	if len(ids) == strayPage {
		*page = ids[len(ids)-1]
	}
	for _, id := range ids {
		if s.holds(id) {
			continue
		}
		err := handBack(ctx, store.TaskTransitionParams{ID: id, Node: s.node})
		switch {
		case err == nil:
			s.log.Warn("handed back a task this node had claimed without knowing (the claim's answer was lost, e.g. in a failover)", "task_id", id.Hex(), "claimed_into_running", running)
		case errors.Is(err, store.ErrLostTask):
		default:
			s.log.Debug("hand back a stray claim", "task_id", id.Hex(), "error", err)
		}
	}
}
