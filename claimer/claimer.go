package claimer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the claimer needs from the database.
type Store interface {
	TaskClaim(ctx context.Context, p store.TaskClaimParams) (schema.Task, error)
	TaskClaimMany(ctx context.Context, p store.TaskClaimManyParams) (store.TaskClaimManyResult, error)
	TaskClaimCapped(ctx context.Context, p store.TaskClaimCappedParams) (store.TaskClaimManyResult, error)
}

// Queue is a queue this node serves.
type Queue struct {
	ID          bson.ObjectID
	Name        string
	Constructor string
	Sort        schema.Sort
	MaxThreads  int // per node, > 0
	// Control is the queue's task control (timeout, retries), for the
	// runner.
	Control schema.QueueControl
	// Sched orders the queues of a pass (priority, weight) and bounds a
	// claim (max_getwork). Paused queues are not given to the claimer.
	Sched schema.QueueSched
	// CountRunning is the queue's count_running as read (all nodes' tasks
	// in -1/0, a projection), nil when unknown: weights compare
	// cluster-wide shares with it.
	CountRunning *int64
	// Peers names the live other nodes that serve the queue (their
	// heartbeats say so; nodes_pin and nodes_ignore let them), in any
	// order: the queue's listeners are picked among them and this node
	// (Listeners), and the weights' correction is shared with them
	// (nodes).
	Peers []string
	// Deaf names the Peers without a wake-up stream (--poll-only): they
	// are never picked to listen. Full names the nodes, this one too,
	// whose slots for the queue were all taken at their last heartbeat:
	// picked to listen only after the others. Every node ranks every
	// node by its heartbeat, its own included, so that they pick the same
	// listeners (up to a heartbeat's age).
	Deaf, Full []string
}

// nodes is how many live nodes serve q, this one included. Every node
// corrects the shares from the same count_running, so each takes its
// part: it counts its own claims since the read nodes() times (the others
// are taking theirs) and takes 1/nodes() of a deficit. Otherwise the
// nodes together would correct nodes() times the error, and the shares
// would swing.
func (q Queue) nodes() int { return 1 + len(q.Peers) }

// Config configures a Claimer.
type Config struct {
	Node  string
	Store Store
	// Refresh returns the queues this node serves now; it is called on
	// every tick and when a queue changes.
	Refresh func(ctx context.Context) ([]Queue, error)
	// Dispatch receives each claimed task, with its slot taken, and when
	// the claim was asked and answered; it must return quickly (start the
	// work elsewhere) and call Finished when the task is done.
	Dispatch func(q Queue, t schema.Task, claim Timing)
	// Malformed receives a claimed task whose document could not be
	// decoded (only t.ID and t.Raw are known; err is a *schema.DecodeError),
	// slot taken likewise.
	Malformed func(q Queue, t schema.Task, err error)
	// Events, when set, delivers the bus's wake-ups; nil polls only.
	Events message.Subscriber
	// Tick is the fallback interval (default 1 s), jittered by ±10 %.
	Tick time.Duration
	// Batch is the most tasks one batched claim takes (default
	// DefaultBatch; 1 turns batching off). See claim.
	Batch int
	// Linger is how long a batched claim on a quiet node that serves
	// one queue (backlogged, see Quiet; never without Quiet) may wait
	// for a whole batch of free slots (or all the queue's slots, when
	// fewer) before it claims what is free (0: never waits; at most a
	// tenth of QuietAfter). With more queues a
	// wait for one would hold back the others' slots, and with them the
	// priorities. A busy node's slots free up a few at a time, as the tasks
	// it dispatched get a core and end, and a claim for each few costs
	// the server and the node three round trips; the tasks it takes
	// have waited in a backlog, so a few milliseconds more cost them
	// nothing, and a slot idles at most Linger a claim.
	// docs/scaling.md, "Claims that wait for half a batch" and "Claims
	// that wait for a whole batch", has what it pays.
	Linger time.Duration
	// Stagger spaces the nodes' answers to the wake-up for one new task
	// (default DefaultStagger; negative: none). The queue's listeners
	// (Listeners) hear it; each ranks itself among them by a hash of the
	// task's id and the nodes' names, and the node ranked r tries the
	// queue r x Stagger later (r at most maxStaggerRank). The first
	// with a free slot takes the task alone, where all of them would race
	// for it: with fifty idle nodes the race cost pickup p50 30 ms and
	// p99 134 ms. A node ranked last still tries within
	// maxStaggerRank x Stagger, so a busy first choice delays a task by
	// milliseconds, never to the next tick.
	Stagger time.Duration
	// Listeners, when positive, is how many of a queue's nodes keep their
	// wake-up stream for it (0, or without Quiet: every node). With more
	// nodes than that, the ones ranked first by a hash of their names
	// listen (the same ones for every queue the same nodes serve, while
	// none of them is full: Queue.Full), and
	// the rest let their streams go (Config.Quiet hears true while no
	// queue they serve has them among its listeners, none capped and no
	// two of one priority, as for quiet) and find work by the tick and
	// their own finishes, reading the queues every QuietAfter while they
	// hold a task: every stream reads every oplog entry, so fifty
	// listening nodes cost the server fifty reads of every write, and
	// every new task a claim from each. A node that hears a wake-up for a
	// queue it does not listen for (it listens for another) tries after
	// the listeners (maxStaggerRank). The nodes ranked are this one and
	// the queue's Peers but its Deaf (SuggestedListeners).
	Listeners int
	// StartAtClaim, when it says so for a queue, claims its tasks
	// straight into running (store.TaskClaimParams.Start): Dispatch then
	// gets tasks in status 0, to start at once without a start write.
	// Capped queues' claims (transactions) never do.
	StartAtClaim func(Queue) bool
	Clock        clock.Clock
	Logger       *slog.Logger
	// Passed, when set, is called after every pass (a test signal).
	Passed func()
	// Quiet, when set, hears whether the node needs wake-ups: true once
	// every queue it serves has had a backlog for QuietAfter (its last
	// claim got every task it asked for; none capped, no two of one
	// priority, claims not paused), when the claimer claims as its slots
	// free up and a wake-up can tell it nothing; false as soon as one
	// has not. Queues of one priority share the slots by their running
	// tasks across the cluster, which the projector's writes to them
	// tell at once: they keep the wake-ups. True also, with Listeners,
	// while the node listens for none of its queues. Its change stream
	// may close meanwhile (events.Stream.Quiet), and must be reopened
	// with a Rescan: the claimer then tries every queue. While quiet (or
	// not a listener and holding a task) the claimer reads the queues
	// every QuietAfter, as no change of theirs is heard.
	Quiet func(bool)
}

// QuietAfter is how long every queue must have had a backlog before
// Config.Quiet hears true: a queue that runs dry now and then keeps its
// node's wake-ups.
const QuietAfter = 250 * time.Millisecond

// DefaultBatch is the default Config.Batch. PERFORMANCE.md measured
// batches of 64 near the best rate on a backlog; with claims that wait for
// a whole batch (Linger), 48 kept three busy node processes' counter lag
// p99 about a fifth shorter at the median, their rate within the noise
// (docs/scaling.md, "A claim of 48 by default").
const DefaultBatch = 48

// DefaultStagger is the default Config.Stagger: about a claim's round
// trip, so that the node ranked next tries once the first one's claim has
// landed.
const DefaultStagger = 2 * time.Millisecond

// maxStaggerRank bounds a wake-up's delay to maxStaggerRank x Stagger.
const maxStaggerRank = 10

// SuggestedListeners is the Config.Listeners suggested (disbatchd's
// default): three streams, so that a queue's wake-ups outlast one
// listener's death (its peers count it live for a FenceAfter), and a new
// task on a busy listener has two more to go to before the tick. A
// listener whose heartbeat says it has no free slot for the queue ranks
// after those with one (Queue.Full), so it is replaced within a
// heartbeat or two.
const SuggestedListeners = 3

// listenKey is the "task" whose rank among a queue's nodes picks its
// listeners (rank, score): one key for every queue, so that nodes that
// serve the same queues pick the same few.
var listenKey bson.ObjectID

// Timing is when a claim was sent and when its answer came.
type Timing struct{ Start, End time.Time }

// Stats are counters for metrics.
type Stats struct {
	Claims      int64 // tasks claimed
	WakePasses  int64 // passes started by a wake-up that claimed something
	TickPasses  int64 // passes started by the tick that claimed something
	EmptyClaims int64 // claims that found nothing
	Batches     int64 // batched claims that won tasks
	CapReached  int64 // claims refused by the queue's max_running
	// Contended: tasks a batched claim read that other nodes took first
	// (claim conflicts); LostBatches: batched claims that won none
	// because of them, round after round.
	Contended   int64
	LostBatches int64
	// Passes and PassTime: passes run, and their time in all (on the
	// clock), queue reads and claims included.
	Passes   int64
	PassTime time.Duration
	// Lingers and LingerTime: batched claims that waited for free slots
	// (Config.Linger), and their wait in all (on the clock);
	// LingersTimedOut: those that waited the whole Linger.
	Lingers         int64
	LingerTime      time.Duration
	LingersTimedOut int64
}

// Claimer runs the claim loop, and counts the node's tasks (claimed or
// running) against the limits. Start it, Stop it.
type Claimer struct {
	lifecycle.Base
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
	slots *slots

	wake chan struct{}

	mu      sync.Mutex
	dirty   map[bson.ObjectID]bool // queues to try on the next pass
	all     bool                   // try every queue
	refresh bool                   // re-read the queues first
	// changed are the queues whose change was heard since the queues
	// were last read: a task claimed in them is dispatched with the queue
	// read again (see current).
	changed map[bson.ObjectID]bool
	// capped: the node-wide cap stopped a pass, so any freed slot may
	// serve any queue that had work.
	capped       bool
	retryBlocked bool // try every queue not known to be empty
	stats        Stats
	// newTasks are wake-ups for single new tasks, to be staggered by the
	// loop (which knows the queues' peers).
	newTasks []newTask
	// nullGen and noNull decide whether a claim looks for tasks with
	// node null (Disbatch 4.103's unclaimed) besides node -1, which
	// costs MongoDB a walk over the queue's just-claimed index entries
	// (store.claimFilter). noNull[q] is q's generation (genOf: nullGen
	// plus queueGen[q]) at which a claim of q read candidates without
	// one, or found the queue empty; q's claims leave node null out while
	// that generation has not moved since. nullGen moves on the tick and
	// on WakeAll, queueGen[q] on every event that queues a task in q
	// without showing node -1 (so 4.103's tasks in one queue leave the
	// others' claims alone). A claim that leaves node null out and
	// finds nothing asks again with it before the queue counts as empty,
	// unless the queue was empty at that generation. So a task with node
	// null is claimed within a tick of its turn in the queue's order, and
	// at once when its event is heard.
	//
	// For a fifo queue the entry also keeps from: the first candidate the
	// last claim read, below which it saw nothing to claim. Claims that
	// leave node null out start there (store.TaskClaimParams.From), past
	// the entries of the tasks claimed before, which every scan from the
	// queue's head walks. A task queued below from shows itself by its
	// event (an insert of an id that sorts lower, from another submitter
	// in the same second; a task moved into q by its queue alone; any
	// requeue, which WakeAll answers), which moves q's generation. A
	// claim from there that finds nothing asks again from the head (with
	// node null too, unless the queue was found empty at that generation)
	// before the queue counts as empty: that also finds a task whose
	// event was checked against the bound before the claim that set it
	// returned.
	// A queue's entries in both go when the queues' read no longer
	// returns it (forget).
	nullGen  uint64
	queueGen map[bson.ObjectID]uint64
	noNull   map[bson.ObjectID]noNull

	// owned by the loop goroutine
	due    map[bson.ObjectID]time.Time // staggered wake-ups, by queue
	queues map[bson.ObjectID]Queue
	order  []bson.ObjectID
	empty  map[bson.ObjectID]bool // last claim found nothing
	// backlog: the queue's last claim got every task it asked for; quiet:
	// every queue has had one for QuietAfter, quietFrom since when every
	// queue has had one (zero: not now).
	backlog   map[bson.ObjectID]bool
	quiet     bool
	quietFrom time.Time
	// listensNone: the last read of the queues found this node among the
	// listeners of none (Config.Listeners); told is what Config.Quiet
	// heard last (letsStreamGo). wakers are each queue's listeners other
	// than this node, and whether it is one of them.
	listensNone bool
	told        bool
	wakers      map[bson.ObjectID]wakers
	readAt      time.Time // the queues' last read
	mayQuiet    bool      // the queues' last read allows quiet (mayQuiet)
	// lingerRest: how long claims did not wait after the last linger
	// that waited in vain (0: that one did not); lingerFrom: when they
	// may wait again.
	lingerRest time.Duration
	lingerFrom time.Time
	// reads counts the queue reads: a pass and a claim holding copies of
	// queues read before the last take them from c.queues again.
	reads int
	// spread: the queue's batched claims pick at random among this many
	// times as many candidates (store.TaskClaimManyParams.Spread), doubled
	// (up to maxSpread) after a claim other nodes contended, halved after
	// one they did not; 1 (no entry) claims in order. A queue with peers
	// (not sorted by priority) reads at least as many times as it has
	// nodes, up to MaxClaimBatch candidates (claimMany).
	spread map[bson.ObjectID]int
	// readHeld is this node's slots per queue when the queues were last
	// read: claims and finishes since count on top of count_running.
	readHeld map[bson.ObjectID]held
	nextBuf  nextBuf
}

// New returns a claimer; nothing runs until Start.
func New(cfg Config) *Claimer {
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	cfg.Batch = min(cfg.Batch, store.MaxClaimBatch)
	if cfg.Stagger == 0 {
		cfg.Stagger = DefaultStagger
	}
	if cfg.Quiet == nil {
		cfg.Listeners = 0 // a stream that is never let go hears every wake-up
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Claimer{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "claimer"),
		clock:    clock.Or(cfg.Clock),
		slots:    newSlots(),
		wake:     make(chan struct{}, 1),
		queues:   map[bson.ObjectID]Queue{},
		empty:    map[bson.ObjectID]bool{},
		backlog:  map[bson.ObjectID]bool{},
		due:      map[bson.ObjectID]time.Time{},
		spread:   map[bson.ObjectID]int{},
		noNull:   map[bson.ObjectID]noNull{},
		queueGen: map[bson.ObjectID]uint64{},
	}
}

// Start subscribes to the events and starts the loop, whose first pass
// reads the queues and tries them all. Stop ends the loop; no claim starts
// after Stop returns.
func (c *Claimer) Start(ctx context.Context) error {
	return c.Base.Start(ctx, func(_ context.Context, run *lifecycle.Run) error {
		c.mu.Lock()
		c.dirty, c.all, c.refresh, c.changed = map[bson.ObjectID]bool{}, true, true, map[bson.ObjectID]bool{}
		c.mu.Unlock()
		// A new run's stream starts with its wake-ups.
		c.backlog, c.quiet, c.quietFrom = map[bson.ObjectID]bool{}, false, time.Time{}
		c.listensNone, c.told, c.wakers = false, false, nil
		if c.cfg.Events != nil {
			for _, topic := range []string{events.TopicTasks, events.TopicQueues, events.TopicRescan} {
				if err := events.Listen(run.Context(), c.cfg.Events, topic, run.Go, func(ev any, err error) { c.handle(run.Context(), topic, ev, err) }); err != nil {
					return err
				}
			}
		}
		run.Go(c.loop)
		c.signal()
		return nil
	})
}

// Batch is the most tasks one claim takes (Config.Batch, defaulted and
// bounded).
func (c *Claimer) Batch() int { return c.cfg.Batch }

// Stats returns the counters.
func (c *Claimer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Finished tells the claimer that a task of q it dispatched (or handed to
// Malformed) is done: its slot is free, and q is tried again unless its
// last claim found it empty.
func (c *Claimer) Finished(q bson.ObjectID) {
	c.slots.release(q)
	c.mark(q, false)
}

// Pause stops claiming until Resume(reason); tasks held stay. Several
// reasons may hold at once. It reports whether the reason was new.
func (c *Claimer) Pause(reason PauseReason) bool { return c.slots.pause(reason) }

// Resume lifts one reason given to Pause; it reports whether it held.
// The caller wakes the queues (WakeAll) when claims may resume.
func (c *Claimer) Resume(reason PauseReason) bool { return c.slots.resume(reason) }

// SetNodeMax sets the node-wide cap on tasks held (nil: none) and reports
// whether it changed. The caller wakes the queues (WakeAll) when a raised
// cap may allow claims now.
func (c *Claimer) SetNodeMax(max *int) bool { return c.slots.setNodeMax(max) }

// Running returns how many tasks of q the node holds (claimed or running).
func (c *Claimer) Running(q bson.ObjectID) int { return c.slots.running(q) }

// Total returns how many tasks the node holds.
func (c *Claimer) Total() int { return c.slots.total() }

// Full reports whether q's slots are all taken, at its per-node
// maxthreads or the node's cap (pauses aside): what the node's heartbeat
// says (Queue.Full).
func (c *Claimer) Full(q bson.ObjectID, maxThreads int) bool { return c.slots.full(q, maxThreads) }

// HasWork tells the claimer that q may have queued tasks.
func (c *Claimer) HasWork(q bson.ObjectID) { c.mark(q, true) }

// Adopt takes a slot of queue q for a task the node did not claim in this
// run (a running task adopted from its supervisor), whatever the caps
// say; Finished gives it back.
func (c *Claimer) Adopt(q bson.ObjectID) { c.slots.take(q) }

// WakeAll asks for a pass over every queue, re-reading them first.
func (c *Claimer) WakeAll() {
	c.mu.Lock()
	c.all, c.refresh = true, true
	c.nullGen++
	c.mu.Unlock()
	c.signal()
}

func (c *Claimer) mark(q bson.ObjectID, work bool) {
	c.mu.Lock()
	if c.dirty == nil { // before Start (an adopted task that ended at once): Start tries every queue anyway
		c.dirty = map[bson.ObjectID]bool{}
	}
	if !work && c.capped {
		c.retryBlocked = true
	}
	if work {
		c.dirty[q] = true
	} else if _, seen := c.dirty[q]; !seen {
		c.dirty[q] = false
	}
	c.mu.Unlock()
	c.signal()
}

func (c *Claimer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// handle is the claimer's reading of an event from the bus (Listen's
// handle): new queued work, a queue's change, or a rescan.
func (c *Claimer) handle(ctx context.Context, topic string, ev any, err error) {
	if err != nil {
		c.log.Warn("undecodable event", "topic", topic, "error", err)
		return
	}
	switch ev := ev.(type) {
	case events.TaskChanged:
		// A task moved to another queue by an update that left its
		// status alone may be queued there: its event shows only the
		// new queue.
		moved := ev.Op == events.OpUpdate && ev.Status == nil && !ev.Queue.IsZero()
		if !moved && (ev.Status == nil || *ev.Status != schema.StatusQueued) {
			return // only queued tasks are work
		}
		if !ev.Queue.IsZero() { // a requeue's WakeAll below moves every queue's generation
			c.mu.Lock()
			if from := c.noNull[ev.Queue].from; !ev.NodeMinusOne || bytes.Compare(ev.ID[:], from[:]) < 0 {
				c.queueGen[ev.Queue]++ // it may have node null, or lie below a claim's bound
			}
			c.mu.Unlock()
		}
		switch {
		case ev.Queue.IsZero():
			c.WakeAll() // a requeue: the event does not say which queue
		case c.cfg.Stagger > 0 && !ev.ID.IsZero():
			c.mu.Lock()
			c.newTasks = append(c.newTasks, newTask{task: ev.ID, queue: ev.Queue})
			c.mu.Unlock()
			c.signal()
		default:
			c.HasWork(ev.Queue)
		}
	case events.QueueChanged:
		if ev.AdmissionsOnly {
			// Room under its max_running moved (a release, or a
			// capped claim): try it, its settings stand.
			c.HasWork(ev.ID)
			return
		}
		c.mu.Lock()
		c.dirty[ev.ID], c.refresh, c.changed[ev.ID] = true, true, true
		c.mu.Unlock()
		c.signal()
	case events.Rescan:
		level := slog.LevelInfo
		if ev.Quiet {
			level = slog.LevelDebug // routine: the stream was let go while the node had work in hand
		}
		c.log.Log(ctx, level, "rescan", "reason", ev.Reason)
		c.WakeAll()
	}
}

func (c *Claimer) loop(ctx context.Context) {
	timer := c.clock.NewTimer(c.jittered())
	defer timer.Stop()
	dueTimer := c.clock.NewTimer(time.Hour)
	dueTimer.Stop()
	defer dueTimer.Stop()
	// While quiet, the queues are read every QuietAfter even when no
	// claim goes out (every slot busy): their changes are not heard.
	quietTimer := c.clock.NewTimer(time.Hour)
	quietTimer.Stop()
	defer quietTimer.Stop()
	quietArmed := false
	for {
		byTick := false
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-quietTimer.C():
			quietArmed = false
		case <-dueTimer.C():
		case <-timer.C():
			byTick = true
			c.mu.Lock()
			c.all, c.refresh = true, true
			c.nullGen++
			c.mu.Unlock()
			timer.Reset(c.jittered())
		}
		if next, ok := c.stagger(); ok {
			dueTimer.Reset(next)
		}
		start := c.clock.Now()
		claimed := c.pass(ctx)
		took := c.clock.Since(start)
		c.mu.Lock()
		c.stats.Passes++
		c.stats.PassTime += took
		switch {
		case claimed > 0 && byTick:
			c.stats.TickPasses++
		case claimed > 0:
			c.stats.WakePasses++
		}
		c.mu.Unlock()
		c.noteQuiet()
		switch {
		case c.readsQuietly() && !quietArmed:
			quietTimer.Reset(QuietAfter)
			quietArmed = true
		case !c.readsQuietly() && quietArmed:
			quietTimer.Stop()
			quietArmed = false
		}
		if c.cfg.Passed != nil {
			c.cfg.Passed()
		}
	}
}

// noteQuiet tells Config.Quiet whether the node lets its stream go
// (letsStreamGo), when that changed
// (the loop goroutine: after each claim, as one claim may drain a whole
// backlog, and after each pass).
func (c *Claimer) noteQuiet() {
	if c.cfg.Quiet == nil {
		return
	}
	switch now := c.clock.Now(); {
	case !c.backlogged():
		c.quietFrom = time.Time{}
		if c.quiet {
			c.quiet = false
			c.lingerRest, c.lingerFrom = 0, time.Time{} // a new spell waits afresh
		}
	case c.quietFrom.IsZero():
		c.quietFrom = now
	case !c.quiet && now.Sub(c.quietFrom) >= QuietAfter:
		c.quiet = true
	}
	if tell := c.letsStreamGo(); tell != c.told {
		c.told = tell
		c.cfg.Quiet(tell)
	}
}

// letsStreamGo reports whether the node needs no wake-ups: every queue
// has had a backlog for QuietAfter (quiet), or it listens for none of
// its queues and none of them keeps a quiet node's wake-ups (mayQuiet).
func (c *Claimer) letsStreamGo() bool { return c.quiet || (c.listensNone && c.mayQuiet) }

// wakers are a queue's listeners (Config.Listeners) other than this
// node, and whether this node is one.
type wakers struct {
	peers   []string
	listens bool
}

// listeners picks q's listeners among the nodes that have a stream:
// every one when they are at most k (or k is 0), else the k ranked first
// for listenKey, the Full ones after the others (so that while all are
// full the same k listen). A wake-up is staggered among the listeners
// alone: a node without a stream never hears one.
func listeners(node string, q Queue, k int) wakers {
	peers := q.Peers
	if len(q.Deaf) > 0 {
		peers = slices.DeleteFunc(slices.Clone(peers), func(n string) bool { return slices.Contains(q.Deaf, n) })
	}
	if k <= 0 || 1+len(peers) <= k {
		return wakers{peers: peers, listens: true}
	}
	type scored struct {
		name  string
		full  int // 1: full, ranked after the others
		score uint64
	}
	rank := func(n string) scored {
		s := scored{name: n, score: score(listenKey, n)}
		if slices.Contains(q.Full, n) {
			s.full = 1
		}
		return s
	}
	all := make([]scored, 0, 1+len(peers))
	all = append(all, rank(node))
	for _, n := range peers {
		all = append(all, rank(n))
	}
	slices.SortFunc(all, func(a, b scored) int { // before's order
		return cmp.Or(cmp.Compare(a.full, b.full), cmp.Compare(a.score, b.score), strings.Compare(a.name, b.name))
	})
	w := wakers{peers: make([]string, 0, k)}
	for _, n := range all[:k] {
		if n.name == node {
			w.listens = true
		} else {
			w.peers = append(w.peers, n.name)
		}
	}
	return w
}

// quietReadDue reports whether the queues are to be read again: quiet,
// or its stream let go as a listener of none and holding a task whose
// end may claim more, and not read for QuietAfter (their changes are not
// heard meanwhile). Such a node that holds none claims by its tick, which
// reads them first.
func (c *Claimer) quietReadDue() bool {
	return c.readsQuietly() && c.clock.Since(c.readAt) >= QuietAfter
}

// readsQuietly reports whether the queues are read every QuietAfter.
func (c *Claimer) readsQuietly() bool {
	return c.quiet || (c.letsStreamGo() && c.slots.total() > 0)
}

// quietRead reads the queues on a quiet node, where the read stands for
// every event unheard since the last. No event says which queue changed,
// so every queue is tried, by the pass that read or (a read within a
// claim) the next one: an event would have marked the one that changed
// (a raised maxthreads, or, under a node-wide cap, a paused queue whose
// slots go to the others); one without a free slot costs no claim. And
// each fifo queue's next claim starts at the head, not at the last
// claim's first candidate (TaskClaimParams.From): a task queued below
// that bound (a retry, a dead node's task requeued) is otherwise found
// only through its event. Tasks with node null (Disbatch 4.103's) are
// still left to the claims that look for them, from the tick on.
func (c *Claimer) quietRead(ctx context.Context) {
	c.readQueues(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = true
	for q, e := range c.noNull {
		e.from = bson.ObjectID{}
		c.noNull[q] = e
	}
}

// backlogged reports whether every queue served has a backlog that its
// claims find for themselves.
func (c *Claimer) backlogged() bool {
	if !c.mayQuiet || c.slots.isPaused() {
		return false
	}
	for _, id := range c.order {
		if !c.backlog[id] {
			return false
		}
	}
	return true
}

// mayQuiet reports whether the queues read allow quiet at all: some
// queue, none capped, no two of one priority (those share the slots by
// their running tasks across the cluster, in next, which the
// projector's writes to the queues tell at once). It depends on the
// queues' settings alone, so readQueues sets it once per read, not each
// claim.
func mayQuiet(qs []Queue) bool {
	priorities := make(map[float64]bool, len(qs))
	for _, q := range qs {
		if q.Sched.Capped() || priorities[q.Sched.Priority] {
			return false
		}
		priorities[q.Sched.Priority] = true
	}
	return len(qs) > 0
}

// newTask is a wake-up for one task queued in queue.
type newTask struct{ task, queue bson.ObjectID }

// stagger turns the wake-ups for new tasks into marks, now or at their
// rank's turn, marks the queues whose turn came, and says when the next
// turn is (ok false: none is waiting).
func (c *Claimer) stagger() (next time.Duration, ok bool) {
	c.mu.Lock()
	wakes := c.newTasks
	c.newTasks = nil
	c.mu.Unlock()
	now := c.clock.Now()
	for _, w := range wakes {
		if at, ok := c.due[w.queue]; ok && !at.After(now) {
			continue // already due now: no rank comes sooner (a bulk insert's events stop ranking at the first 0)
		}
		r := 0 // a queue not read yet: at once
		if wk, read := c.wakers[w.queue]; read && wk.listens {
			r = min(rank(w.task, c.cfg.Node, wk.peers), maxStaggerRank)
		} else if read {
			r = maxStaggerRank // heard, though not its listener: after them
		}
		at := now.Add(time.Duration(r) * c.cfg.Stagger)
		if cur, ok := c.due[w.queue]; !ok || at.Before(cur) {
			c.due[w.queue] = at
		}
	}
	var earliest time.Time
	var due []bson.ObjectID
	for q, at := range c.due {
		if !at.After(now) {
			delete(c.due, q)
			due = append(due, q)
			continue
		}
		if earliest.IsZero() || at.Before(earliest) {
			earliest = at
		}
	}
	if len(due) > 0 {
		c.mu.Lock()
		for _, q := range due {
			c.dirty[q] = true
		}
		c.mu.Unlock()
	}
	if earliest.IsZero() {
		return 0, false
	}
	return earliest.Sub(now), true
}

// rank is how many of peers come before node for task: rendezvous
// hashing, so every node computes the same order, and each node comes
// first for its share of the tasks.
func rank(task bson.ObjectID, node string, peers []string) int {
	mine, r := score(task, node), 0
	for _, p := range peers {
		if before(task, p, mine, node) {
			r++
		}
	}
	return r
}

// first says whether node comes first among peers for task (rank 0),
// asking no more peers than it must.
func first(task bson.ObjectID, node string, peers []string) bool {
	mine := score(task, node)
	for _, p := range peers {
		if before(task, p, mine, node) {
			return false
		}
	}
	return true
}

// before says whether peer comes before node (whose score is mine) for
// task.
func before(task bson.ObjectID, peer string, mine uint64, node string) bool {
	sp := score(task, peer)
	return sp < mine || (sp == mine && peer < node)
}

// score is node's place in the order of task's nodes.
func score(task bson.ObjectID, node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(node))
	h.Write(task[:])
	// splitmix64's finalizer: FNV alone orders ids that differ in a
	// counter's last bytes unevenly.
	x := h.Sum64()
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (c *Claimer) jittered() time.Duration {
	j := time.Duration(float64(c.cfg.Tick) * (0.9 + 0.2*rand.Float64()))
	return j
}

// pass claims in the queues marked since the last pass and returns how
// many tasks it claimed.
func (c *Claimer) pass(ctx context.Context) int {
	if c.quietReadDue() {
		c.quietRead(ctx) // this pass tries every queue
	}
	c.mu.Lock()
	dirty, all, refresh, retry := c.dirty, c.all, c.refresh, c.retryBlocked
	c.dirty, c.all, c.refresh, c.retryBlocked, c.capped = map[bson.ObjectID]bool{}, false, false, false, false
	c.mu.Unlock()

	if refresh {
		c.readQueues(ctx)
	}
	var open []Queue // the queues this pass tries
	for _, id := range c.order {
		work, marked := dirty[id]
		if !all && !marked && !retry {
			continue
		}
		if all || work {
			c.empty[id] = false
		}
		if c.empty[id] {
			continue // a slot freed up, but the queue had nothing
		}
		open = append(open, c.queues[id])
	}
	open = c.withHigherPriorities(open)
	claimed := 0
	read := c.reads
	for len(open) > 0 && ctx.Err() == nil {
		if c.reads != read { // read again during the pass (current)
			open, read = c.reread(open), c.reads
			if len(open) == 0 {
				break
			}
		}
		i, limit := c.next(open)
		n, more := c.claim(ctx, open[i], limit)
		claimed += n
		if c.slots.nodeFull() {
			// Every slot is taken: the pass ends here, so that a slot freed
			// from now on goes to the queue the order puts first (a freed
			// slot starts a new pass), not to the next one in this pass.
			break
		}
		if !more {
			open = slices.Delete(open, i, i+1)
		}
	}
	return claimed
}

// readQueues re-reads the queues (the loop goroutine). What it reads holds
// the changes heard until it starts: their marks are cleared, and put back
// when the read fails.
func (c *Claimer) readQueues(ctx context.Context) bool {
	c.mu.Lock()
	heard := c.changed
	c.changed, c.refresh = map[bson.ObjectID]bool{}, false
	c.mu.Unlock()
	qs, err := c.cfg.Refresh(ctx)
	if err != nil {
		c.mu.Lock()
		for id := range heard {
			c.changed[id] = true // read again before their claims go out
		}
		c.mu.Unlock()
		if ctx.Err() == nil {
			c.log.Warn("read queues", "error", err)
		}
		return false
	}
	c.reads++
	c.readAt = c.clock.Now()
	c.mayQuiet = mayQuiet(qs)
	c.queues = make(map[bson.ObjectID]Queue, len(qs))
	c.order = c.order[:0]
	c.readHeld = make(map[bson.ObjectID]held, len(qs))
	c.wakers = make(map[bson.ObjectID]wakers, len(qs))
	c.listensNone = len(qs) > 0
	for _, q := range qs {
		c.queues[q.ID] = q
		wk := listeners(c.cfg.Node, q, c.cfg.Listeners)
		c.wakers[q.ID] = wk
		c.listensNone = c.listensNone && !wk.listens
		c.order = append(c.order, q.ID)
		var h held
		h.running, h.released = c.slots.held(q.ID)
		c.readHeld[q.ID] = h
	}
	c.forget()
	return true
}

// forget drops what the claimer keeps per queue for the queues the last
// read did not return (deleted, or no longer served by this node), so a
// node that outlives many short-lived queues does not keep an entry for
// each. A queue served again starts afresh: not known to be empty, no
// spread, node null looked for. Its noNull and queueGen entries go
// together, and no claim of it is in flight meanwhile (claims and this
// run in the loop goroutine, and a claim records what it saw before its
// tasks are dispatched): so no generation recorded before can meet the
// queue's generation after. The loop goroutine.
func (c *Claimer) forget() {
	served := func(id bson.ObjectID) bool { _, ok := c.queues[id]; return ok }
	maps.DeleteFunc(c.empty, func(id bson.ObjectID, _ bool) bool { return !served(id) })
	maps.DeleteFunc(c.backlog, func(id bson.ObjectID, _ bool) bool { return !served(id) })
	maps.DeleteFunc(c.due, func(id bson.ObjectID, _ time.Time) bool { return !served(id) })
	maps.DeleteFunc(c.spread, func(id bson.ObjectID, _ int) bool { return !served(id) })
	c.slots.forget(served)
	c.mu.Lock()
	defer c.mu.Unlock()
	maps.DeleteFunc(c.noNull, func(id bson.ObjectID, _ noNull) bool { return !served(id) })
	maps.DeleteFunc(c.queueGen, func(id bson.ObjectID, _ uint64) bool { return !served(id) })
}

// reread replaces the queues of open by their last read, leaving out those
// no longer served.
func (c *Claimer) reread(open []Queue) []Queue {
	out := open[:0]
	for _, q := range open {
		if now, ok := c.queues[q.ID]; ok {
			out = append(out, now)
		}
	}
	return out
}

// current is q as tasks claimed in it are to be dispatched with. changed:
// its change was heard after the queues were last read, so they are read
// again and q is taken from that read. A pass reads the queues, then
// claims; a queue changed and a task inserted in between would otherwise
// run under the queue's old settings, though the stream delivered the
// change before the insert. (The pass and the claim take their copies of
// the queues from such a read too: see reads.)
func (c *Claimer) current(ctx context.Context, q Queue, changed bool) Queue {
	if !changed || !c.readQueues(ctx) {
		return q
	}
	if now, ok := c.queues[q.ID]; ok {
		return now
	}
	return q // no longer served: its claimed tasks run as it was
}

// withHigherPriorities adds to open every queue not known to be empty whose
// priority is above the lowest in open: a pass woken for a queue (a task
// inserted, a slot freed, a queue changed) must not serve it while a
// higher priority may still have work.
func (c *Claimer) withHigherPriorities(open []Queue) []Queue {
	if len(open) == 0 {
		return open
	}
	lowest := open[0].Sched.Priority
	in := make(map[bson.ObjectID]bool, len(open))
	for _, q := range open {
		lowest = min(lowest, q.Sched.Priority)
		in[q.ID] = true
	}
	for _, id := range c.order {
		if q := c.queues[id]; !in[id] && !c.empty[id] && q.Sched.Priority > lowest {
			open = append(open, q)
		}
	}
	return open
}

// next picks the queue to claim from (seed 001's scheduler): the highest
// priority; among equal priorities the one whose running tasks for its
// weight would be fewest with one more (ties: the earlier in name order). limit is how many to
// claim from it before choosing again: its part of this node's free slots
// when they are shared out among the queues of its priority so that
// their shares (running/weight) come out as even as can be (water
// filling, each queue taking no more than its own free slots here); at
// least 1, and no limit without another queue of its priority. One claim
// can then take a batch where a choice after every task would make one
// round trip per task.
func (c *Claimer) next(open []Queue) (i, limit int) {
	// Each queue's counts are read once (a lock per queue), not per
	// comparison, into buffers the pass reuses: a pass may hold a
	// thousand queues.
	nb := &c.nextBuf
	nb.share, nb.running, nb.local = nb.share[:0], nb.running[:0], nb.local[:0]
	for _, q := range open {
		local, released := c.slots.held(q.ID)
		running := c.clusterRunningFrom(q, held{local, released})
		share := math.Inf(1) // weight 0: only when nothing else has work
		if q.Sched.Weight > 0 {
			// The share the queue would have with one more task: by the
			// share it has, a tie at an integer boundary goes to the
			// lighter queue every time, and the shares settle off the
			// weights (1:2:4 over 30 slots at 5:9:16, not 4:9:17).
			share = float64(running+1) / q.Sched.Weight
		}
		nb.share, nb.running, nb.local = append(nb.share, share), append(nb.running, running), append(nb.local, local)
	}
	best := 0
	for j := 1; j < len(open); j++ {
		a, b := open[j].Sched.Priority, open[best].Sched.Priority
		if a > b || (a == b && nb.share[j] < nb.share[best]) {
			best = j
		}
	}
	b := open[best]
	if math.IsInf(nb.share[best], 1) {
		return best, math.MaxInt // weight 0: the only queue left with work
	}
	// The queues of best's priority that could take a slot here.
	// Every node serving best fills its own free slots from the same
	// counts, so the level is the cluster's: as if each had as many free
	// slots and room as this one, and this node takes 1/Nodes of best's
	// part.
	nb.peers = nb.peers[:0]
	for j, q := range open {
		if q.Sched.Priority != b.Sched.Priority || math.IsInf(nb.share[j], 1) {
			continue
		}
		nb.peers = append(nb.peers, fillPeer{running: float64(nb.running[j]), weight: q.Sched.Weight,
			room: float64(max(0, q.MaxThreads-nb.local[j]) * q.nodes())})
	}
	if len(nb.peers) == 1 {
		return best, math.MaxInt
	}
	free := c.slots.free()
	if free < math.MaxInt32 {
		free *= b.nodes()
	}
	target := nb.fillLevel(free) * b.Sched.Weight
	if target >= math.MaxInt32 {
		return best, math.MaxInt
	}
	// The epsilon keeps a target computed as 2.9999999 from losing a slot.
	part := (math.Floor(target+1e-9) - float64(nb.running[best])) / float64(b.nodes())
	return best, max(int(math.Ceil(part-1e-9)), 1)
}

// nextBuf are next's buffers, owned by the loop goroutine.
type nextBuf struct {
	share   []float64
	running []int
	local   []int
	peers   []fillPeer
	events  []fillEvent
}

// fillPeer is a queue taking part in a water filling: its cluster-wide
// running count, its weight, and how many more it can take (on this node,
// times the nodes serving it: the fill is the cluster's; free is scaled by
// the chosen queue's nodes, which is exact when the peers share their
// nodes, as they usually do).
type fillPeer struct{ running, weight, room float64 }

// fillEvent is where a peer's intake starts (its share, slope +weight) or
// stops (its room filled, slope -weight) as the level rises.
type fillEvent struct{ level, slope float64 }

// fillLevel is the level L to which free slots raise the peers' shares:
// the slots given, Σ clamp(L·weight − running, 0, room), equal free (or
// every peer's room, when that is less).
func (nb *nextBuf) fillLevel(free int) float64 {
	nb.events = nb.events[:0]
	var rooms float64
	for _, p := range nb.peers {
		start := p.running / p.weight
		nb.events = append(nb.events, fillEvent{start, p.weight}, fillEvent{start + p.room/p.weight, -p.weight})
		rooms += p.room
	}
	slices.SortFunc(nb.events, func(x, y fillEvent) int { return cmp.Compare(x.level, y.level) })
	want := min(float64(free), rooms)
	level, given, slope := nb.events[0].level, 0.0, 0.0
	for _, e := range nb.events {
		next := given + slope*(e.level-level)
		if slope > 0 && next >= want {
			return level + (want-given)/slope
		}
		given, level = next, e.level
		slope += e.slope
	}
	return level
}

// held is a node's slots in a queue: in use, and given back ever.
type held struct{ running, released int }

// clusterRunningFrom is q's running tasks across the cluster as best
// known, from this node's own slots (now): its count_running as last
// read, plus the tasks this node claimed since once for every node
// serving the queue (when a deficit shows, all of them fill it at once:
// each takes its part, and counts the others'), minus the tasks it
// finished since once (finishes come one by one, on their own: counted
// N times, one finish made its queue look N short, and a node refilled
// the queue it had just left, so a node's mix never changed between two
// reads and a slot too many stayed there); its own count when the queue
// has no count_running yet.
func (c *Claimer) clusterRunningFrom(q Queue, now held) int {
	if q.CountRunning == nil {
		return now.running
	}
	then := c.readHeld[q.ID]
	finished := now.released - then.released
	claimed := now.running - then.running + finished
	return max(int(*q.CountRunning)+q.nodes()*claimed-finished, now.running)
}

// LingerRests and MaxLingerRest: after a linger that waited its whole
// Config.Linger in vain, the node's slots free up too slowly for waiting
// to pay (its tasks run, rather than wait for a core), and its claims do
// not wait for LingerRests x Linger, twice as long after each further
// linger in vain, at most MaxLingerRest. A linger that gets its slots
// ends the rests.
const (
	LingerRests   = 10
	MaxLingerRest = time.Second
)

// MaxLinger is the longest Config.Linger: longer waits would hold the
// claim loop (and the quiet reads it makes) too long.
const MaxLinger = QuietAfter / 10

// linger waits, on a quiet node and at most Config.Linger, until q has
// room for the most a claim of it could take (a batch, or fewer slots),
// or for want when less (the loop goroutine, before a batched claim).
// Half of it was the goal until stop 52: waiting for the whole took a
// quarter more tasks a second from the same server.
func (c *Claimer) linger(ctx context.Context, q Queue, want, batch int) {
	// One queue served, and the node still quiet by the last queue read
	// (a read within this pass may have ended it before noteQuiet runs).
	if c.cfg.Linger <= 0 || batch <= 1 || !c.quiet || len(c.order) != 1 || !c.backlogged() ||
		c.clock.Now().Before(c.lingerFrom) {
		return
	}
	// Slots another queue holds under the node-wide cap are not waited
	// for (a queue this node no longer serves may hold them a while);
	// nor can a task of q's that runs long be told from the others: the
	// lingers then run out in vain, and the rests stop them.
	goal := min(want, batch, c.slots.capacity(q.ID, q.MaxThreads))
	if c.slots.isPaused() || c.slots.room(q.ID, q.MaxThreads) >= goal {
		return
	}
	start := c.clock.Now()
	timer := c.clock.NewTimer(min(c.cfg.Linger, MaxLinger))
	defer timer.Stop()
	timedOut := false
wait:
	for c.slots.room(q.ID, q.MaxThreads) < goal && !c.slots.isPaused() {
		select {
		case <-ctx.Done():
			break wait
		case <-timer.C():
			// The last slot may have come with the clock.
			timedOut = c.slots.room(q.ID, q.MaxThreads) < goal && !c.slots.isPaused()
			break wait
		case <-c.slots.changed:
		}
	}
	took := c.clock.Since(start)
	switch {
	case timedOut:
		c.lingerRest = min(MaxLingerRest, max(LingerRests*c.cfg.Linger, 2*c.lingerRest))
		c.lingerFrom = c.clock.Now().Add(c.lingerRest)
	case ctx.Err() == nil:
		c.lingerRest = 0
	}
	c.mu.Lock()
	c.stats.Lingers++
	c.stats.LingerTime += took
	if timedOut {
		c.stats.LingersTimedOut++
	}
	c.mu.Unlock()
}

// claim takes up to limit tasks of q into its free slots. The first claim
// of a pass is one findOneAndUpdate, the fastest way to take a task that
// just arrived. Once a claim succeeded and slots are still free, a backlog
// may be waiting, so the rest are taken in batches of up to Batch (and
// the queue's max_getwork) with one update-then-find claim each
// (store.TaskClaimMany): three round trips per batch instead of one per
// task, and no fight over the queue's head document with other nodes. more
// reports whether q may give more in this pass (limit reached with slots
// and work left).
func (c *Claimer) claim(ctx context.Context, q Queue, limit int) (n int, more bool) {
	batch := c.cfg.Batch
	if q.Sched.MaxGetwork > 0 {
		batch = min(batch, q.Sched.MaxGetwork)
	}
	defer func() {
		if c.slots.nodeFull() {
			c.mu.Lock()
			c.capped = true
			c.mu.Unlock()
		}
	}()
	batched := false
	// Asking again after a claim that left node null out found nothing:
	// withNull looks for node null (from the head) whatever noNull says,
	// fromHead leaves it out but reads from the head.
	withNull, fromHead := false, false
	read := c.reads
	for {
		if n >= limit {
			return n, true
		}
		if c.reads != read { // read again since (current)
			now, ok := c.queues[q.ID]
			if !ok {
				return n, false
			}
			q, read = now, c.reads
		}
		want := 1
		if batched {
			want = min(batch, limit-n)
			c.linger(ctx, q, want, batch)
		}
		got := 0
		for got < want && c.slots.reserve(q.ID, q.MaxThreads) {
			got++
		}
		if got == 0 {
			return n, false
		}
		release := func(k int) { c.slots.releaseReserved(q.ID, k) }
		if ctx.Err() != nil {
			release(got)
			return n, false
		}
		var won int
		var err error
		// A capped claim (a transaction, rarer) always looks for both.
		nc := c.nullChoice(q.ID, withNull || q.Sched.Capped(), fromHead)
		short := false // the queue held fewer than got
		switch {
		case q.Sched.Capped():
			won, _, short, err = c.claimMany(ctx, q, got, nc)
		case got == 1:
			won, err = c.claimOne(ctx, q, nc)
			short = won == 0
		default:
			var lost bool
			won, lost, short, err = c.claimMany(ctx, q, got, nc)
			if lost {
				// Other nodes won every task the batch read, round after
				// round: the atomic single claim tells whether the queue
				// is empty (a queue wrongly marked empty would let lower
				// priorities in).
				release(got - 1)
				got = 1
				won, err = c.claimOne(ctx, q, nc)
				short = won == 0
			}
		}
		c.slots.settle(q.ID, won) // its tasks are out: held, no longer reserved
		if err == nil && won == 0 && nc.skip && (!nc.wasEmpty || !nc.from.IsZero()) {
			// Nothing with node -1 (from the bound): the queue is empty
			// only if it has nothing with node null either, unless it had
			// none when it was last found empty; and only if nothing with
			// node -1 lies below the bound (a task whose event was heard
			// while the claim that set the bound was out, checked against
			// the bound before).
			release(got)
			if nc.wasEmpty {
				fromHead = true
			} else {
				withNull = true
			}
			continue
		}
		withNull, fromHead = false, false // noNull decides again
		n += won
		c.backlog[q.ID] = err == nil && won > 0 && !short
		c.noteQuiet() // a backlog may be drained in one long claim
		if c.quietReadDue() {
			c.quietRead(ctx) // the loop's top takes q from it; the next pass (a slot's end, or the quiet timer) tries every queue
		}
		switch {
		case err != nil:
			release(got - won)
			if ctx.Err() == nil {
				c.log.Warn("claim failed; retrying on the next wake-up or tick", "queue", q.Name, "error", err)
			}
			return n, false
		case won == 0:
			release(got)
			c.empty[q.ID] = true
			c.mu.Lock()
			c.stats.EmptyClaims++
			c.mu.Unlock()
			return n, false
		}
		release(got - won)
		batched = true
	}
}

// maxSpread bounds the spread a contended claim doubles up to: a batch
// picks among at most 8 times as many candidates (and MaxClaimBatch). A
// queue shared with peers reads wider when it has more nodes (claimMany).
const maxSpread = 8

// ClaimTimeout bounds one claim. A claim is not cancelled by Stop: one the
// server applied must reach Dispatch, or its tasks would stay claimed by a
// node that never runs them.
const ClaimTimeout = 10 * time.Second

// noNull is what a claim that looked for node null too found, at the
// queue's generation gen (genOf): no task with node null among its
// candidates, or (empty) no task at all; and the fifo claims' bound.
type noNull struct {
	gen   uint64
	empty bool
	from  bson.ObjectID
}

// nullChoice is whether a claim leaves node null out (skip), the queue's
// generation it decided at, and whether the queue was empty at that gen.
type nullChoice struct {
	skip, wasEmpty bool
	gen            uint64
	from           bson.ObjectID // the claim's lower bound (fifo, with skip)
}

// nullChoice decides for a claim of q (see Claimer.nullGen); with, it
// looks for node null whatever noNull says; fromHead, it has no bound.
func (c *Claimer) nullChoice(q bson.ObjectID, with, fromHead bool) nullChoice {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen, ok := c.noNull[q]
	gen := c.genOf(q)
	nc := nullChoice{skip: !with && ok && seen.gen == gen, gen: gen}
	nc.wasEmpty = nc.skip && seen.empty
	if nc.skip && !fromHead {
		nc.from = seen.from
	}
	return nc
}

// genOf is q's generation (see Claimer.nullGen): it moves whenever
// nullGen or queueGen[q] does, as neither goes down while noNull[q] is
// kept (forget drops both of q's entries at once). Under c.mu.
func (c *Claimer) genOf(q bson.ObjectID) uint64 { return c.nullGen + c.queueGen[q] }

// nullSeen records what a claim of q that looked for node null too read:
// nullNode candidates with node null, or (empty) nothing at all. None
// says there is none before the last candidate in claim order; the claims
// that follow may pass a later one, until q's generation moves.
//
// first is the first candidate it read (fifo; zero when unknown), below
// which it saw nothing to claim: the next claims start there. A claim
// that left node null out only moves that bound: up to first, or, when it
// found nothing from the head, away.
func (c *Claimer) nullSeen(q bson.ObjectID, nc nullChoice, nullNode int, empty bool, first bson.ObjectID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc.skip {
		// The entry is the one nullChoice read: only the loop, claim
		// after claim, writes noNull.
		if e, ok := c.noNull[q]; ok {
			switch {
			case !first.IsZero():
				e.from = first
			case empty && nc.from.IsZero():
				e.from = bson.ObjectID{}
			}
			c.noNull[q] = e
		}
		return
	}
	if nullNode > 0 {
		delete(c.noNull, q)
		return
	}
	c.noNull[q] = noNull{gen: nc.gen, empty: empty, from: first}
}

// claimOne claims one task into a slot already taken.
func (c *Claimer) claimOne(ctx context.Context, q Queue, nc nullChoice) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ClaimTimeout)
	defer cancel()
	start := c.clock.Now()
	t, err := c.cfg.Store.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: c.cfg.Node, Sort: q.Sort, Start: c.startAtClaim(q),
		SkipNullNode: nc.skip, From: nc.from})
	var de *schema.DecodeError
	switch {
	case err == nil:
		if nc.skip && q.Sort == schema.SortFIFO {
			c.nullSeen(q.ID, nc, 0, false, t.ID) // the first it could claim
		}
		c.mu.Lock()
		c.stats.Claims++
		changed := c.changed[q.ID]
		c.mu.Unlock()
		end := c.clock.Now()
		c.cfg.Dispatch(c.current(ctx, q, changed), t, Timing{Start: start, End: end})
		return 1, nil
	case errors.As(err, &de):
		c.cfg.Malformed(q, t, err)
		return 1, nil
	case errors.Is(err, store.ErrNoTask):
		c.nullSeen(q.ID, nc, 0, true, bson.ObjectID{})
		return 0, nil
	}
	return 0, err
}

// startAtClaim says whether q's claims go straight into running.
func (c *Claimer) startAtClaim(q Queue) bool {
	return c.cfg.StartAtClaim != nil && !q.Sched.Capped() && c.cfg.StartAtClaim(q)
}

// claimMany claims up to limit tasks into slots already taken. lost: none,
// because other nodes won every task it read (the queue may hold more);
// short: the queue held fewer than limit (store.TaskClaimManyResult.Short;
// a capped claim: it won fewer).
func (c *Claimer) claimMany(ctx context.Context, q Queue, limit int, nc nullChoice) (won int, lost, short bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ClaimTimeout)
	defer cancel()
	start := c.clock.Now()
	var res store.TaskClaimManyResult
	spread := c.spread[q.ID]
	if q.Sched.Capped() {
		// max_running: the claim and its admissions are one transaction.
		res, err = c.cfg.Store.TaskClaimCapped(ctx, store.TaskClaimCappedParams{Queue: q.ID, Node: c.cfg.Node, Sort: q.Sort, Limit: limit, Max: q.Sched.MaxRunning})
		if errors.Is(err, store.ErrCapReached) {
			// Full: the release that frees an admission writes the queue,
			// and that change wakes this queue again.
			c.mu.Lock()
			c.stats.CapReached++
			c.mu.Unlock()
			return 0, false, false, nil
		}
	} else {
		var prefer func(bson.ObjectID) bool
		if len(q.Peers) > 0 && q.Sort != schema.SortPriority {
			// Each node takes first the tasks it comes first for among
			// the queue's nodes (rank, as the wake-ups' stagger), from a
			// read wide enough to hold a batch for each node (as far as
			// MaxClaimBatch goes: fifty nodes claiming 8 each read 256,
			// where a read capped at maxSpread held a fifth of a batch of
			// a node's own and they fought over the rest). Not by
			// priority: there a node would take its own lower-priority
			// tasks before others' higher ones.
			node, peers := c.cfg.Node, q.Peers
			spread, prefer = max(spread, min(q.nodes(), (store.MaxClaimBatch+limit-1)/limit)), func(id bson.ObjectID) bool { return first(id, node, peers) }
		}
		res, err = c.cfg.Store.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: c.cfg.Node, Sort: q.Sort, Limit: limit, Start: c.startAtClaim(q),
			Spread: spread, Prefer: prefer, SkipNullNode: nc.skip, From: nc.from})
		if err == nil {
			c.nullSeen(q.ID, nc, res.NullNode, len(res.Tasks)+len(res.Malformed) == 0 && !res.Lost, res.First)
		}
	}
	if err != nil {
		return 0, false, false, err
	}
	if q.Sched.Capped() {
		res.Short = len(res.Tasks)+len(res.Malformed) < limit
	}
	switch sp := c.spread[q.ID]; {
	case res.Contended > 0:
		c.spread[q.ID] = min(maxSpread, max(2, 2*spread))
	case sp > 1:
		c.spread[q.ID] = sp / 2
	}
	timing := Timing{Start: start, End: c.clock.Now()}
	c.mu.Lock()
	c.stats.Claims += int64(len(res.Tasks))
	if len(res.Tasks)+len(res.Malformed) > 0 {
		c.stats.Batches++
	}
	c.stats.Contended += int64(res.Contended)
	if res.Lost {
		c.stats.LostBatches++
	}
	changed := c.changed[q.ID]
	c.mu.Unlock()
	if len(res.Tasks) > 0 {
		q = c.current(ctx, q, changed)
	}
	for _, t := range res.Tasks {
		c.cfg.Dispatch(q, t, timing)
	}
	for i, t := range res.Malformed {
		c.cfg.Malformed(q, t, res.Errors[i])
	}
	return len(res.Tasks) + len(res.Malformed), res.Lost, res.Short, nil
}
