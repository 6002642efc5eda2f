package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
)

// nodeSpec describes in-process nodes to start on one database.
type nodeSpec struct {
	DB         string
	Count      int
	Name       string // nodes are Name-1, Name-2, ...
	MaxThreads int
	PollOnly   bool
	Plugins    *plugin.Registry
	Observer   node.Observer
	// Supervise runs the shell and exec tasks under supervisors.
	Supervise *supervisor.Launcher
	// LagWindow: node.Config.ProjectorLagWindow.
	LagWindow int
}

// nodes are running in-process nodes, each with its own client and store.
type nodes struct {
	list    []*node.Node
	clients []*mongo.Client
}

// startNodes starts spec.Count nodes at once and returns when all claim.
func (e *env) startNodes(ctx context.Context, spec nodeSpec) (*nodes, error) {
	ns := &nodes{list: make([]*node.Node, spec.Count)}
	for i := range spec.Count {
		c, err := e.connect()
		if err != nil {
			ns.stop()
			return nil, err
		}
		ns.clients = append(ns.clients, c)
		maxThreads := spec.MaxThreads
		n, err := node.New(node.Config{
			Name:               fmt.Sprintf("%s-%d", spec.Name, i+1),
			Store:              store.New(c.Database(spec.DB), store.Options{}),
			Plugins:            spec.Plugins,
			MaxThreads:         &maxThreads,
			ClaimBatch:         e.cfg.ClaimBatch,
			ClaimLinger:        nodeLinger(e.cfg.ClaimLinger),
			ClaimRunning:       e.cfg.ClaimRunning,
			PreImagesIdle:      e.cfg.PreImagesIdle,
			PollOnly:           spec.PollOnly,
			Observer:           spec.Observer,
			Logger:             e.nodeLog,
			Supervise:          spec.Supervise,
			SuperviseMongo:     supervisor.Mongo{URI: e.uri, Database: spec.DB},
			ProjectorLagWindow: spec.LagWindow,
		})
		if err != nil {
			ns.stop()
			return nil, err
		}
		ns.list[i] = n
	}
	errs := make([]error, spec.Count)
	var wg sync.WaitGroup
	for i, n := range ns.list {
		wg.Go(func() { errs[i] = n.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		ns.stop()
		return nil, fmt.Errorf("start nodes: %w", err)
	}
	return ns, nil
}

// stop stops every node at once and disconnects their clients.
func (ns *nodes) stop() {
	var wg sync.WaitGroup
	for _, n := range ns.list {
		if n != nil {
			wg.Go(n.Stop)
		}
	}
	wg.Wait()
	for _, c := range ns.clients {
		disconnect(c)
	}
	ns.list, ns.clients = nil, nil
}

// projectorStats is what untilSteady asks (*node.Node).
type projectorStats interface{ ProjectorStats() projections.Stats }

// untilSteady polls nodes every 10 ms until the projector of one of them
// is steady (projections.Stats.Steady), and is false when ctx ends or give
// closes first.
func untilSteady(ctx context.Context, give <-chan struct{}, nodes ...projectorStats) bool {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		for _, n := range nodes {
			if n.ProjectorStats().Steady {
				return true
			}
		}
		select {
		case <-t.C:
		case <-give:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// untilCommitted polls nodes every 5 ms until no projector among them is
// committing a batch (projections.Stats.Committing), for up to wait: a
// batch whose counters were read is then in the stats. It is false when
// one still was.
func untilCommitted(wait time.Duration, nodes ...projectorStats) bool {
	deadline := time.Now().Add(wait)
	for {
		busy := false
		for _, n := range nodes {
			busy = busy || n.ProjectorStats().Committing
		}
		if !busy {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// steadyWait bounds the wait for a steady projector before a drain: its
// pre-images go off PreImagesIdle after its term starts.
func (e *env) steadyWait() time.Duration { return e.cfg.PreImagesIdle + 10*time.Second }

// projectorStats returns the nodes for untilSteady.
func (ns *nodes) projectorStats() []projectorStats {
	out := make([]projectorStats, len(ns.list))
	for i, n := range ns.list {
		out[i] = n
	}
	return out
}

// projector returns the statistics of the node that applied the most
// projection events (the lease holder).
func (ns *nodes) projector() (projections.Stats, string) {
	var best projections.Stats
	name := ""
	for i, n := range ns.list {
		st := n.ProjectorStats()
		if name == "" || st.Events > best.Events {
			best, name = st, fmt.Sprintf("node %d of %d", i+1, len(ns.list))
		}
	}
	return best, name
}

// drainObserver counts claims and finishes of a drain (node.Observer).
type drainObserver struct {
	base       time.Time
	target     int64
	firstClaim atomic.Int64 // ns since base, +1 so that 0 means none yet
	lastFinish atomic.Int64 // ns since base
	finished   atomic.Int64
	done       chan struct{}
	once       sync.Once
}

// newDrainObserver closes Done once target tasks finished.
func newDrainObserver(target int) *drainObserver {
	return &drainObserver{base: time.Now(), target: int64(target), done: make(chan struct{})}
}

func (o *drainObserver) TaskClaimed(string) {
	o.firstClaim.CompareAndSwap(0, int64(time.Since(o.base))+1)
}

func (o *drainObserver) TaskStarted(string, time.Duration) {}

func (o *drainObserver) TaskControlled(string, string, int) {}

func (o *drainObserver) TaskFinished(string, schema.Status, time.Duration, bool) {
	now := int64(time.Since(o.base))
	for {
		last := o.lastFinish.Load()
		if now <= last || o.lastFinish.CompareAndSwap(last, now) {
			break
		}
	}
	if o.finished.Add(1) == o.target {
		o.once.Do(func() { close(o.done) })
	}
}

// Done is closed when the target was reached.
func (o *drainObserver) Done() <-chan struct{} { return o.done }

// result is how many finished and over which span, from the first claim
// to the last finish.
func (o *drainObserver) result() (finished int, span time.Duration) {
	first := o.firstClaim.Load()
	if first == 0 {
		return 0, 0
	}
	return int(o.finished.Load()), time.Duration(o.lastFinish.Load() - (first - 1))
}

// times are the first claim and the last finish, Unix nanoseconds (0:
// none).
func (o *drainObserver) times() (firstClaim, lastFinish int64) {
	first := o.firstClaim.Load()
	if first == 0 {
		return 0, 0
	}
	return o.base.Add(time.Duration(first - 1)).UnixNano(), o.base.Add(time.Duration(o.lastFinish.Load())).UnixNano()
}

// wait waits for the target, ctx or timeout; it reports whether the target
// was reached.
func (o *drainObserver) wait(ctx context.Context, timeout time.Duration) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-o.done:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// nodeLinger is the node Config.ClaimLinger of the bench's --claim-linger,
// whose 0 is none (the node's 0 is its default).
func nodeLinger(d time.Duration) time.Duration {
	if d <= 0 {
		return node.NoClaimLinger
	}
	return d
}
