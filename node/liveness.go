package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// liveness keeps the node alive in the cluster's eyes and acts on what the
// cluster says back: it writes the node document every Heartbeat (seed
// 000), reads the operator's maxthreads and drain request from it in the
// same round trip, fences the node when no heartbeat has been acknowledged
// for FenceAfter, and carries out a drain.
//
// The timing argument: the document's timestamp is the server's clock when
// the write was applied, which is after the node sent it. The node measures
// its silence on its own clock from when it sent the last acknowledged
// heartbeat, so it fences no later than FenceAfter (plus one watchdog
// period) after that timestamp, and its plugins are dead milliseconds
// later. The other nodes declare it dead only when the server's clock
// passes timestamp + DeadAfter, and DeadAfter - FenceAfter is at least
// FenceMargin. No clock of a node is compared with another's.
type liveness struct {
	lifecycle.Base
	cfg    livenessConfig
	target livenessTarget
	clock  clock.Clock
	log    *slog.Logger

	// fencing orders a fence and a rejoin with what they do to the node:
	// a rejoin decided between a fence's flag and its pause would leave
	// the node paused for good.
	fencing sync.Mutex

	mu     sync.Mutex
	lastOK time.Time // when the last acknowledged heartbeat was sent
	// servingSince is when the node last started serving: its first
	// heartbeat, or the one that ended a fence.
	servingSince time.Time
	fenced       bool
	draining     bool
	badDoc       bool // the document could not be read back
	drained      chan struct{}
}

// livenessConfig is what liveness needs of the node's config.
type livenessConfig struct {
	Name       string
	Store      heartbeatStore
	MaxThreads *int // the node's own cap (--maxthreads)
	// WakeupStream: the node follows a change stream for new tasks (not
	// --poll-only); its heartbeat says so (schema.NodeWakeupStream).
	WakeupStream bool
	Heartbeat    time.Duration
	FenceAfter   time.Duration
	DeadAfter    time.Duration
	beatFault    func(ctx context.Context) error // test signal: a heartbeat (its write's ctx) fails with this error when non-nil
	beaten       func()                          // test signal: a heartbeat was acknowledged
}

// heartbeatStore writes the node document.
type heartbeatStore interface {
	NodeUpsert(ctx context.Context, p store.NodeUpsertParams) (schema.Node, error)
}

// livenessTarget is what liveness acts on: the rest of the node.
type livenessTarget interface {
	// heartbeatQueues returns the heartbeat's queues[] entries and the
	// ids of the queues served and of those full (schema.NodeServes).
	heartbeatQueues() (queues []schema.NodeQueue, serves, full []string)
	// fence stops claiming and kills the running tasks; rejoin undoes it.
	fence(silence time.Duration)
	rejoin()
	// drain stops claiming for the rest of the run; held counts the
	// tasks still held.
	drain()
	held() int
	// leftBehind counts the tasks the run leaves in the node's name as it
	// stops (left running under supervisors, or with results unwritten).
	leftBehind() int
	// beatAcked: a heartbeat sent at sent was acknowledged.
	beatAcked(sent time.Time)
	// setMaxThreads sets the node-wide cap (nil: none).
	setMaxThreads(limit *int)
}

func newLiveness(cfg livenessConfig, target livenessTarget, c clock.Clock, log *slog.Logger) *liveness {
	return &liveness{cfg: cfg, target: target, clock: clock.Or(c), log: log, drained: make(chan struct{})}
}

// Start writes the first heartbeat (which clears a drain request left from
// a previous run and starts the silence clock) and then beats and watches
// until Stop.
func (l *liveness) Start(ctx context.Context) error {
	return l.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		l.mu.Lock()
		l.fenced, l.draining = false, false
		select {
		case <-l.drained: // carried out in an earlier run
			l.drained = make(chan struct{})
		default:
		}
		l.mu.Unlock()
		if err := l.write(ctx, run, schema.NodeStateRunning, true); err != nil {
			return err
		}
		failing := false
		run.Every(l.clock, l.cfg.Heartbeat, func(ctx context.Context) {
			// Stop does not cancel a heartbeat in flight but waits for it
			// (at most its timeout): cancelled, its write may still be
			// applied on the server after the last heartbeat's "stopped",
			// and leave a stopped node's document saying it runs.
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout())
			err := l.beat(bctx, run)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				l.log.Warn("heartbeat failed", "error", err, "fence_after", l.cfg.FenceAfter)
				failing = true
			case err == nil && failing:
				l.log.Info("heartbeat written again")
				failing = false
			}
		})
		// The watchdog runs apart from the writes, which may hang for their
		// whole timeout.
		run.Every(l.clock, min(100*time.Millisecond, l.cfg.FenceAfter/10), func(context.Context) {
			if s := l.silence(); s > l.cfg.FenceAfter {
				l.fence(s)
			}
		})
		return nil
	})
}

// lastAcked is when the last acknowledged heartbeat was sent.
func (l *liveness) lastAcked() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastOK
}

// last is the heartbeat after the node stopped: state stopped, and how
// many tasks it leaves in its name (schema.NodeLeftTasks).
func (l *liveness) last(ctx context.Context) error {
	return l.write(ctx, nil, schema.NodeStateStopped, false)
}

func (l *liveness) beat(ctx context.Context, run *lifecycle.Run) error {
	state := schema.NodeStateRunning
	if l.isDraining() {
		state = schema.NodeStateDraining
	}
	return l.write(ctx, run, state, false)
}

// write writes once and acts on what the document said: the node-wide cap
// (the smaller of the node's own --maxthreads and the document's), a drain
// request, and whether another node declared this one dead meanwhile.
func (l *liveness) write(ctx context.Context, run *lifecycle.Run, state string, first bool) error {
	sent := l.clock.Now()
	if f := l.cfg.beatFault; f != nil {
		if err := f(ctx); err != nil {
			return err
		}
	}
	queues, serves, full := l.target.heartbeatQueues()
	left := 0
	if state == schema.NodeStateStopped {
		left = l.target.leftBehind()
	}
	before, err := l.cfg.Store.NodeUpsert(ctx, store.NodeUpsertParams{
		Node: l.cfg.Name, Queues: queues, Serves: serves, Full: full, WakeupStream: l.cfg.WakeupStream, State: state, ClearDrain: first,
		LeftTasks: left, OwnMaxThreads: l.cfg.MaxThreads, FenceAfter: l.cfg.FenceAfter,
	})
	var de *schema.DecodeError
	if errors.As(err, &de) {
		// Written, but what an operator put on the document cannot be
		// read: the heartbeat counts (no fencing over a typo), its cap and
		// drain request do not.
		l.unreadable(err)
		before, err = schema.Node{Node: l.cfg.Name}, nil
	} else if err == nil {
		l.unreadable(nil)
	}
	if err != nil {
		return err
	}
	l.fencing.Lock()
	l.mu.Lock()
	if sent.After(l.lastOK) {
		l.lastOK = sent
	}
	wasFenced := l.fenced
	if first || wasFenced {
		l.servingSince = l.clock.Now()
	}
	l.fenced = false
	l.mu.Unlock()
	if before.Dead {
		l.log.Warn("this node had been declared dead (its heartbeat was too old): its claimed tasks went back to the queue and its running ones were orphaned; writes for them will fail and be logged",
			"declared_by", before.DeadBy, "declared_at", before.DeadAt)
	}
	l.target.beatAcked(sent)
	if wasFenced {
		l.log.Info("heartbeat acknowledged again: rejoining and claiming")
		l.target.rejoin()
	}
	l.fencing.Unlock()
	limit := l.cfg.MaxThreads
	if before.MaxThreads != nil && (limit == nil || *before.MaxThreads < *limit) {
		limit = before.MaxThreads
	}
	l.target.setMaxThreads(limit)
	// A drain request read by a heartbeat that outlasted Stop is moot:
	// this run is ending, and the next clears it at its first heartbeat.
	if !first && state != schema.NodeStateStopped && before.Drain && (run == nil || run.Context().Err() == nil) {
		l.drain(run)
	}
	if l.cfg.beaten != nil {
		l.cfg.beaten()
	}
	return nil
}

// fence stops claiming and kills the running tasks, once per silence:
// nothing this node runs may overlap a re-run elsewhere once the others
// declare it dead.
func (l *liveness) fence(silence time.Duration) {
	l.fencing.Lock()
	defer l.fencing.Unlock()
	l.mu.Lock()
	was := l.fenced
	l.fenced = true
	l.mu.Unlock()
	if was {
		return
	}
	l.log.Error("fenced: no heartbeat acknowledged; stopped claiming and killing running tasks so that none can overlap a re-run elsewhere (the node rejoins when MongoDB answers)",
		"silent_for", silence.Round(time.Millisecond), "fence_after", l.cfg.FenceAfter, "dead_after", l.cfg.DeadAfter, "running", l.target.held())
	l.target.fence(silence)
}

// drain carries out an operator's drain request, once a run: no more
// claims, and Drained closes when every task held has finished.
func (l *liveness) drain(run *lifecycle.Run) {
	l.mu.Lock()
	was := l.draining
	l.draining = true
	drained := l.drained
	l.mu.Unlock()
	if was || run == nil {
		return
	}
	l.target.drain()
	l.log.Info("drain requested: no more claims; exiting when the running tasks finish", "running", l.target.held())
	run.Go(func(ctx context.Context) {
		t := l.clock.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for l.target.held() > 0 {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
		}
		l.log.Info("drained: every task this node held has finished")
		close(drained)
	})
}

// Drained is closed when a drain request of this run has been carried out.
func (l *liveness) Drained() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.drained
}

func (l *liveness) isFenced() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fenced
}

func (l *liveness) isDraining() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.draining
}

// mayJudge reports whether the node has been serving for DeadAfter, long
// enough to call another node's old heartbeat a death rather than an
// outage everybody shared (see reaper.Config.MayJudge).
func (l *liveness) mayJudge() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.servingSince.IsZero() && l.clock.Since(l.servingSince) >= l.cfg.DeadAfter
}

// unreadable logs, once per change, whether the node document could be read
// back.
func (l *liveness) unreadable(err error) {
	l.mu.Lock()
	was := l.badDoc
	l.badDoc = err != nil
	l.mu.Unlock()
	switch {
	case err != nil && !was:
		l.log.Warn("heartbeat written, but the node document cannot be read back: its maxthreads and drain request are ignored until it is fixed", "error", err)
	case err == nil && was:
		l.log.Info("node document readable again")
	}
}

// silence is how long ago the last acknowledged heartbeat was sent.
func (l *liveness) silence() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.clock.Since(l.lastOK)
}

// timeout bounds one heartbeat write: long enough for a slow primary, short
// enough that the next attempt comes soon after MongoDB answers again.
func (l *liveness) timeout() time.Duration {
	return max(l.cfg.Heartbeat, min(5*time.Second, l.cfg.FenceAfter/2))
}
