package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// queueStore reads the queues and the node's config document.
type queueStore interface {
	QueueList(ctx context.Context) (store.QueueListResult, error)
	ConfigGet(ctx context.Context, label string) (schema.Config, error)
	NodeList(ctx context.Context) (store.NodeListResult, error)
}

// queueSet reads the queues and decides which this node serves. It logs a
// queue's reason for being ignored (or a malformed document) once, and again
// only when the reason changes.
type queueSet struct {
	node    string
	label   string
	store   queueStore
	plugins *plugin.Registry
	log     *slog.Logger
	// live: a node whose heartbeat is at most this old (by the server's
	// clock) counts as serving the queues its heartbeat says it serves
	// (liveOthers).
	live time.Duration
	// active and ignore, when either is set, replace the config
	// document's activequeues and ignorequeues (Config.ActiveQueues).
	active, ignore []string
	clock          clock.Clock

	// others is liveOthers' last read of the nodes, at othersAt (zero:
	// none to reuse), under othersMu.
	othersMu sync.Mutex
	others   map[string]peer
	self     peer
	othersAt time.Time

	mu     sync.Mutex
	all    []schema.Queue // every readable queue, for the heartbeat
	served map[bson.ObjectID]claimer.Queue
	// mine are the ids (hex, sorted) of the queues this node would serve
	// but for what stops every node alike (a pause, maxthreads 0): its
	// heartbeat's serves, so that its peers know it at once on a resume.
	mine []string
	said map[string]string // queue id (or document) -> last reason logged
}

// refresh is the claimer's Refresh.
func (qs *queueSet) refresh(ctx context.Context) ([]claimer.Queue, error) {
	res, err := qs.store.QueueList(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	cfg, err := qs.store.ConfigGet(ctx, qs.label)
	if ctx.Err() != nil {
		return nil, ctx.Err() // stopping: not a config problem
	}
	var bad *schema.DecodeError
	switch {
	case err == nil || errors.Is(err, store.ErrNotFound):
	case errors.As(err, &bad) || errors.Is(err, store.ErrConfigAmbiguous):
		// The document is there but says nothing usable: as if none.
		seen["config"] = true
		qs.sayOnce("config", "config", err.Error())
		cfg = schema.Config{}
	default:
		// Not read (no primary, a broken connection): the claimer keeps
		// the queues it has. Taking it for no config would serve the
		// queues the config's activequeues or ignorequeues keep from
		// this node.
		return nil, err
	}
	if len(qs.active) > 0 || len(qs.ignore) > 0 {
		cfg.ActiveQueues, cfg.IgnoreQueues = qs.active, qs.ignore
	}
	for _, m := range res.Malformed {
		key := m.Error()
		var de *schema.DecodeError
		if errors.As(m, &de) {
			key = de.ID
		}
		seen[key] = true
		qs.sayOnce(key, "malformed queue ignored", m.Error())
	}
	others, self := qs.liveOthers(ctx)
	var served []claimer.Queue
	var mine []string
	for _, q := range res.Queues {
		key := q.ID.Hex()
		seen[key] = true
		for _, w := range q.Warnings {
			seen[key+"/"+w] = true
			qs.sayOnce(key+"/"+w, "queue", w, "queue", q.Name)
		}
		why := qs.notThisNode(q, cfg)
		if why == "" {
			mine = append(mine, key)
			why = notNow(q)
		}
		if why != "" {
			qs.sayOnce(key, "queue ignored", why, "queue", q.Name)
			continue
		}
		qs.sayOnce(key, "queue served", "", "queue", q.Name, "constructor", q.Constructor, "maxthreads", *q.MaxThreads)
		peers, deaf, full := serving(q, others)
		if self.full[key] {
			full = append(full, qs.node) // as its peers read it
		}
		served = append(served, claimer.Queue{ID: q.ID, Name: q.Name, Constructor: q.Constructor, Sort: q.Sort, MaxThreads: *q.MaxThreads,
			Control: q.Control, Sched: q.Sched, CountRunning: q.CountRunning, Peers: peers, Deaf: deaf, Full: full})
	}
	slices.Sort(mine)
	qs.mu.Lock()
	qs.mine = mine
	qs.all = res.Queues
	qs.served = make(map[bson.ObjectID]claimer.Queue, len(served))
	for _, q := range served {
		qs.served[q.ID] = q
	}
	for k := range qs.said {
		if !seen[k] {
			delete(qs.said, k) // deleted queues, fixed documents may come back
		}
	}
	qs.mu.Unlock()
	return served, nil
}

// othersFresh is how long a read of the nodes serves liveOthers. Nodes
// read their queues every QuietAfter behind a backlog and on queue
// changes besides, and the read of every node's heartbeat each time grew
// with the nodes squared: fifty nodes made about 200 such reads a second,
// each examining fifty documents. The peers it tells change at the pace
// of heartbeats (one a second), and a node is live for FenceAfter after
// its last.
const othersFresh = time.Second

// peer is what a live node's heartbeat says of it: the queues it serves
// (by hex id), whether it follows a wake-up stream, and the queues whose
// slots it had all taken (full).
type peer struct {
	serves map[string]bool
	stream bool
	full   map[string]bool
}

// liveOthers are the other live nodes of this project, by name: not dead,
// running, a heartbeat at most live old by the server's clock, as read at
// most othersFresh ago; and what this node's own heartbeat said, as read
// with them (self: its peers rank it by that too). A heartbeat with
// serves tells which queues its node serves, which are full and whether
// it has a stream; one without (this project's nodes before serves was
// written) is taken to serve every queue it lists in queues (every queue
// it can read), with a stream, none full. Disbatch 4.103 nodes (no state)
// are left out: they do not share by weight. None when the nodes cannot
// be read (each node then corrects alone, as with one node), and the next
// call reads again.
func (qs *queueSet) liveOthers(ctx context.Context) (others map[string]peer, self peer) {
	qs.othersMu.Lock()
	defer qs.othersMu.Unlock()
	now := qs.clock.Now()
	if !qs.othersAt.IsZero() && now.Sub(qs.othersAt) < othersFresh {
		return qs.others, qs.self
	}
	res, err := qs.store.NodeList(ctx)
	if err != nil {
		if ctx.Err() == nil {
			qs.log.Warn("reading the nodes for the weights failed; this pass counts this node alone", "error", err)
		}
		return nil, peer{}
	}
	out := map[string]peer{}
	self = peer{}
	for _, n := range res.Nodes {
		if n.Dead || n.State != schema.NodeStateRunning || res.Now.Sub(n.Timestamp) > qs.live {
			continue
		}
		p := peer{serves: make(map[string]bool, len(n.Queues)), stream: true}
		if n.Serves == nil {
			for _, q := range n.Queues {
				p.serves[q.ID] = true
			}
		} else {
			p.stream = n.WakeupStream
			for _, id := range n.Serves {
				p.serves[id] = true
			}
			for _, id := range n.Full {
				if p.full == nil {
					p.full = map[string]bool{}
				}
				p.full[id] = true
			}
		}
		if n.Node == qs.node {
			self = p
			continue
		}
		out[n.Node] = p
	}
	qs.others, qs.self, qs.othersAt = out, self, now
	return out, self
}

// serving names the live other nodes that serve q, in no order: their
// heartbeat says so (liveOthers) and the queue's nodes_pin and
// nodes_ignore let them (the claimer's Peers); those of them without a
// wake-up stream (Deaf); and those with one whose slots for q were all
// taken at their last heartbeat (Full).
func serving(q schema.Queue, others map[string]peer) (names, deaf, full []string) {
	for name, p := range others {
		switch {
		case !p.serves[q.ID.Hex()]:
		case len(q.NodesPin) > 0 && !slices.Contains(q.NodesPin, name):
		case len(q.NodesPin) == 0 && slices.Contains(q.NodesIgnore, name):
		default:
			names = append(names, name)
			switch {
			case !p.stream:
				deaf = append(deaf, name)
			case p.full[q.ID.Hex()]:
				full = append(full, name)
			}
		}
	}
	return names, deaf, full
}

// sayOnce logs msg for key when reason differs from what was last logged.
// An empty reason logs at info level (a queue is served), others at warn.
func (qs *queueSet) sayOnce(key, msg, reason string, attrs ...any) {
	qs.mu.Lock()
	last, ok := qs.said[key]
	if qs.said == nil {
		qs.said = map[string]string{}
	}
	qs.said[key] = reason
	qs.mu.Unlock()
	if ok && last == reason {
		return
	}
	if reason == "" {
		qs.log.Info(msg, attrs...)
		return
	}
	qs.log.Warn(msg, append(attrs, "reason", reason)...)
}

// listSource names where the queue lists came from when not the config
// document.
func (qs *queueSet) listSource() string {
	if len(qs.active) > 0 || len(qs.ignore) > 0 {
		return " (this node's, from its settings)"
	}
	return ""
}

// notThisNode says why this node does not serve q while others may, or
// "": its pins and ignores, the config's queue lists, its plugins.
func (qs *queueSet) notThisNode(q schema.Queue, cfg schema.Config) string {
	name := qs.node
	switch {
	case len(q.NodesPin) > 0 && !slices.Contains(q.NodesPin, name):
		return "pinned to other nodes (nodes_pin)"
	case len(q.NodesPin) == 0 && slices.Contains(q.NodesIgnore, name):
		return "this node is in nodes_ignore"
	case len(cfg.ActiveQueues) > 0 && !slices.Contains(cfg.ActiveQueues, q.ID.Hex()) && !slices.Contains(cfg.ActiveQueues, q.Name):
		return "not in the config's activequeues" + qs.listSource()
	case len(cfg.ActiveQueues) == 0 && (slices.Contains(cfg.IgnoreQueues, q.ID.Hex()) || slices.Contains(cfg.IgnoreQueues, q.Name)):
		return "in the config's ignorequeues" + qs.listSource()
	}
	if _, ok := qs.plugins.Lookup(q.Constructor); !ok {
		hint := " (start it with --plugin " + q.Constructor + "=PATH for an external program"
		switch q.Constructor {
		case plugin.ShellConstructor, plugin.ExecConstructor:
			hint = " (start it with --enable-plugin " + q.Constructor
		}
		return "no plugin for constructor " + q.Constructor + " on this node" + hint + "; its tasks wait for a node that has it)"
	}
	return ""
}

// notNow says why no node serves q for now, or "".
func notNow(q schema.Queue) string {
	switch {
	case q.Threads() == 0:
		return "maxthreads is 0 or null: the queue runs nothing"
	case q.Sched.Paused:
		return "paused"
	case q.Sched.BalanceHold:
		return "held by QueueBalance: its cap for now is 0"
	case q.Sched.Weight < 0:
		return "its weight is negative: not scheduled"
	}
	return ""
}

// stats returns the heartbeat's queues[] entries, serves (mine) and full:
// the served queues whose slots are all taken (isFull: the claimer's
// Full), ids hex and sorted; one snapshot, so that full is within serves.
// tasks_doing is this node's tasks of the queue in -1 or 0 (running(q));
// tasks_todo and tasks_done come from the queue's counters (count_todo,
// count_total) when it has them.
func (qs *queueSet) stats(running func(q bson.ObjectID) int, isFull func(q bson.ObjectID, maxThreads int) bool) (queues []schema.NodeQueue, serves, full []string) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	queues = make([]schema.NodeQueue, 0, len(qs.all))
	for _, q := range qs.all {
		doing := int64(running(q.ID))
		e := schema.NodeQueue{Name: q.Name, ID: q.ID.Hex(), Constructor: q.Constructor, MaxThreads: q.MaxThreads, TasksDoing: doing}
		if q.CountTodo != nil {
			e.TasksTodo = max(0, *q.CountTodo-doing)
			if q.CountTotal != nil {
				e.TasksDone = max(0, *q.CountTotal-*q.CountTodo)
			}
		}
		queues = append(queues, e)
	}
	for id, q := range qs.served {
		if isFull(id, q.MaxThreads) {
			full = append(full, id.Hex())
		}
	}
	slices.Sort(full)
	return queues, qs.mine, full
}
