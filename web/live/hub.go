package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Store opens change streams; *store.Store is one.
type Store interface {
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
	// TasksPreImages says whether the tasks collection keeps pre-images
	// (the projector turns them on while another program writes tasks).
	TasksPreImages(ctx context.Context) (bool, error)
}

// Lookup reads queues and nodes; *store.Store is one. With it the hub
// accepts queue names in ?queue= and names the queue or node of update and
// delete events that do not carry the name themselves.
type Lookup interface {
	QueueGet(ctx context.Context, p store.QueueGetParams) (schema.Queue, error)
	QueueList(ctx context.Context) (store.QueueListResult, error)
	NodeList(ctx context.Context) (store.NodeListResult, error)
}

// Defaults of Options.
const (
	DefaultBuffer       = 1024
	DefaultKeepAlive    = 15 * time.Second
	DefaultRetry        = 2 * time.Second
	DefaultMaxAwait     = 200 * time.Millisecond
	DefaultHistory      = 4096
	DefaultWriteTimeout = 10 * time.Second
)

// handoverWait bounds how long a replay waits for the hub to reach the
// event it stopped at (the hub is a few milliseconds behind at most, unless
// it is overloaded); then the replay goes on by itself.
const handoverWait = 2 * time.Second

// stopGrace bounds how long Stop waits for the handlers of the streams it
// ended (their writes are cut at once).
const stopGrace = 5 * time.Second

// Options configure a Hub.
type Options struct {
	Store Store
	// Lookup is optional: without it ?queue= takes ids only, and the
	// events that do not carry a queue's or node's name have "name"/"node"
	// null.
	Lookup Lookup
	Logger *slog.Logger
	// Clock times the keep-alives (the hub's change streams and the
	// bounds of single waits run on real time).
	Clock clock.Clock
	// Buffer is how many events may wait for one client; a client further
	// behind is dropped (event lagged). Default DefaultBuffer.
	Buffer int
	// KeepAlive is the interval of the ": keep-alive" comments. Default
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// Retry is the reconnection delay sent to clients once ("retry:").
	// Default DefaultRetry.
	Retry time.Duration
	// MaxAwait is how long the server holds an empty getMore of the
	// hub's change stream: events are delivered as soon as they come
	// whatever it is; it sets how often an idle stream's position (the
	// id keep-alives carry) moves on, and bounds the delay of a resuming
	// client's hand-over. Default DefaultMaxAwait.
	MaxAwait time.Duration
	// History is how many recent positions the hub remembers, so that a
	// client resuming from one of them is served by the hub at once
	// rather than by a replay of its own. Default DefaultHistory.
	History int
	// WriteTimeout bounds each write to a client (the server's own
	// WriteTimeout is lifted for the stream). Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// OnError, when set, writes the error responses (400, 405, 503)
	// instead of WriteError: the web server's own writer, so that every
	// route answers alike.
	OnError func(w http.ResponseWriter, r *http.Request, err *Error)
	// PreImagesCheck is how often the hub reads whether the tasks
	// collection keeps pre-images, to ask its change streams for them
	// only while it does (the server otherwise looks one up for every
	// update, found or not). Default DefaultPreImagesCheck.
	PreImagesCheck time.Duration
}

// DefaultPreImagesCheck is Options.PreImagesCheck's default.
const DefaultPreImagesCheck = 10 * time.Second

// preImagesReadTimeout bounds one read of the setting.
const preImagesReadTimeout = 5 * time.Second

// Validate checks the options.
func (o Options) Validate() error {
	switch {
	case o.Store == nil:
		return errors.New("live events: no store")
	case o.Buffer < 0, o.History < 0:
		return errors.New("live events: buffer and history must not be negative")
	case o.KeepAlive < 0, o.Retry < 0, o.MaxAwait < 0, o.WriteTimeout < 0, o.PreImagesCheck < 0:
		return errors.New("live events: durations must not be negative")
	}
	return nil
}

func (o *Options) defaults() {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.KeepAlive, DefaultKeepAlive)
	def(&o.Retry, DefaultRetry)
	def(&o.MaxAwait, DefaultMaxAwait)
	def(&o.WriteTimeout, DefaultWriteTimeout)
	def(&o.PreImagesCheck, DefaultPreImagesCheck)
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	if o.History <= 0 {
		o.History = DefaultHistory
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Clock = clock.Or(o.Clock)
}

// Stats are the hub's counters.
type Stats struct {
	Subscribers int   // clients connected
	Replaying   int   // of which on a replay of their own (resumed, not yet handed over)
	Published   int64 // change events the hub's stream delivered
	Dropped     int64 // clients dropped for falling Buffer events behind
	Handovers   int64 // replays handed over to the hub
	Resets      int64 // reset events sent (positions lost, collections dropped)
	// PreImages: the hub's streams ask for task pre-images (the tasks
	// collection keeps them, as last read).
	PreImages bool
}

// Hub follows one change stream (profile StreamTransitions) and fans its
// events out to every subscriber. It is a service (Start, Stop) and the
// http.Handler of the endpoint.
type Hub struct {
	lifecycle.Base
	opts     Options
	log      *slog.Logger
	names    *names
	maxBatch int // of the change streams; 0: the store's default (tests split batches)

	mu       sync.Mutex
	running  bool
	runCtx   context.Context
	all      map[*sub]struct{} // every subscriber
	attached map[*sub]struct{} // those the hub feeds
	ring     *ring
	pos      string         // after the last batch published
	posTime  bson.Timestamp // of pos
	evTime   bson.Timestamp // of the last event published
	evIdx    int            // its index among the events of its cluster time
	readers  sync.WaitGroup // replays
	handlers sync.WaitGroup // ServeHTTP calls that joined

	published, dropped, handovers, resets atomic.Int64
	preImages                             atomic.Bool
}

// New returns a hub; nothing runs until Start.
func New(opts Options) *Hub {
	opts.defaults()
	return &Hub{opts: opts, log: opts.Logger.With("component", "live"), names: newNames()}
}

// Start opens the hub's change stream before it returns (so a client
// joining afterwards misses no change committed after it joined) and
// follows it until Stop. It fails when the deployment has no change
// streams.
func (h *Hub) Start(ctx context.Context) error {
	return h.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		if err := h.opts.Validate(); err != nil {
			return err
		}
		h.preImages.Store(true) // unless read otherwise: an event may need one
		h.readPreImages(ctx)
		r, err := h.open(ctx, store.Position{})
		if err != nil {
			return fmt.Errorf("live events: %w", err)
		}
		h.learnNames(ctx)
		h.mu.Lock()
		h.running, h.runCtx = true, run.Context()
		h.all, h.attached = map[*sub]struct{}{}, map[*sub]struct{}{}
		h.ring = newRing(h.opts.History)
		h.pos, h.posTime, h.evTime, h.evIdx = "", bson.Timestamp{}, bson.Timestamp{}, 0
		h.mu.Unlock()
		run.Cleanup(h.closeAll)
		run.Go(func(ctx context.Context) {
			defer func() { r.Close() }()
			checked := h.opts.Clock.Now()
			var at bson.Raw // after the last batch published
			for {
				b, err := r.Next(ctx)
				if err != nil {
					return // stopped
				}
				h.publish(b)
				if b.Token != nil {
					at = b.Token
				}
				if at != nil && h.opts.Clock.Since(checked) >= h.opts.PreImagesCheck {
					checked = h.opts.Clock.Now()
					if h.readPreImages(ctx) {
						r = h.reopen(ctx, r, at)
					}
				}
			}
		})
		return nil
	})
}

// open opens the hub's stream from (the present when zero), asking for
// pre-images as the hub last read them kept.
func (h *Hub) open(ctx context.Context, from store.Position) (*store.StreamReader, error) {
	return h.opts.Store.StreamOpen(ctx, store.StreamParams{
		Profile: store.StreamTransitions, Name: "live", MaxAwait: h.opts.MaxAwait, MaxBatch: h.maxBatch, Logger: h.log,
		From: from, NoPreImages: !h.preImages.Load(),
	})
}

// readPreImages reads whether the tasks collection keeps pre-images and
// says whether that changed. A failed read keeps what was known.
func (h *Hub) readPreImages(ctx context.Context) (changed bool) {
	ctx, cancel := context.WithTimeout(ctx, preImagesReadTimeout) // the publishing goroutine waits for it
	defer cancel()
	on, err := h.opts.Store.TasksPreImages(ctx)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("live events: cannot read whether tasks keep pre-images; asking as before", "error", err)
		}
		return false
	}
	return h.preImages.Swap(on) != on
}

// reopen follows the hub's stream again from at, asking for pre-images
// or not as just read; on failure the old stream goes on (the next check
// tries again).
func (h *Hub) reopen(ctx context.Context, old *store.StreamReader, at bson.Raw) *store.StreamReader {
	next, err := h.open(ctx, store.Position{Token: at})
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("live events: cannot reopen the change stream to follow the tasks' pre-images; going on as before", "error", err)
		}
		h.preImages.Store(!h.preImages.Load())
		return old
	}
	old.Close()
	h.log.Info("live events: task pre-images " + map[bool]string{true: "kept: asking for them", false: "not kept: no longer asking for them"}[h.preImages.Load()])
	return next
}

// learnNames reads the names of queues and nodes, after the stream is open
// so that it sees every rename after the read.
func (h *Hub) learnNames(ctx context.Context) {
	if h.opts.Lookup == nil {
		return
	}
	if qs, err := h.opts.Lookup.QueueList(ctx); err != nil {
		h.log.Warn("read queue names; queue events that do not carry one have name null", "error", err)
	} else {
		for _, q := range qs.Queues {
			h.names.setID(h.names.queues, q.ID, &q.Name)
		}
	}
	if ns, err := h.opts.Lookup.NodeList(ctx); err != nil {
		h.log.Warn("read node names; node events that do not carry one have node null", "error", err)
	} else {
		for _, n := range ns.Nodes {
			h.names.setID(h.names.nodes, n.ID, &n.Node)
		}
	}
}

// closeAll ends every subscriber and waits for their replays and (a
// bounded time) for their handlers.
func (h *Hub) closeAll() {
	h.mu.Lock()
	h.running = false
	for s := range h.all {
		s.end(endStopped)
	}
	h.attached = map[*sub]struct{}{}
	h.mu.Unlock()
	h.readers.Wait()
	done := make(chan struct{})
	go func() {
		h.handlers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopGrace):
		// A handler blocked in a write that no deadline can cut (a
		// ResponseWriter without SetWriteDeadline) ends with its write.
		h.log.Warn("live events: some client streams did not end on Stop")
	}
}

// Stats returns the counters.
func (h *Hub) Stats() Stats {
	st := Stats{Published: h.published.Load(), Dropped: h.dropped.Load(), Handovers: h.handovers.Load(), Resets: h.resets.Load(), PreImages: h.preImages.Load()}
	h.mu.Lock()
	defer h.mu.Unlock()
	st.Subscribers = len(h.all)
	for s := range h.all {
		if s.private {
			st.Replaying++
		}
	}
	return st
}

// publish fans one batch of the hub's stream out.
func (h *Hub) publish(b store.StreamBatch) {
	pos := encodeID(b.Token)
	if b.Lost != "" {
		h.log.Warn("live events: change stream position lost; clients are told to re-read (event reset)", "reason", b.Lost)
		reset := resetItem(pos, "change history lost: "+b.Lost)
		h.resets.Add(1)
		h.mu.Lock()
		defer h.mu.Unlock()
		// The stream follows the present again: the ring starts afresh.
		h.ring.clear()
		h.evTime, h.evIdx = bson.Timestamp{}, 0
		if t, ok := store.TokenTime(b.Token); ok {
			h.ring.begin(t)
		}
		h.ring.add(ringEntry{id: pos})
		if pos != "" {
			h.pos, h.posTime = pos, tokenTime(b.Token, h.posTime)
		}
		for s := range h.attached {
			h.deliver(s, []*item{reset}, pos)
		}
		return
	}
	items := make([]*item, len(b.Events))
	ids := make([]string, len(b.Events))
	for i, ev := range b.Events {
		items[i] = convert(ev, h.names, true)
		if items[i] != nil {
			ids[i] = items[i].id
			if items[i].kind == kindControl {
				h.resets.Add(1)
			}
		} else {
			ids[i] = encodeID(ev.Token)
		}
	}
	h.published.Add(int64(len(b.Events)))
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ring.ready {
		// The first batch since the start: the stream has every event
		// from here on.
		if len(b.Events) > 0 {
			h.ring.begin(b.Events[0].ClusterTime)
		} else if t, ok := store.TokenTime(b.Token); ok {
			h.ring.begin(t)
		}
	}
	for i, ev := range b.Events {
		if ev.ClusterTime.Equal(h.evTime) {
			h.evIdx++
		} else {
			h.evTime, h.evIdx = ev.ClusterTime, 0
		}
		if it := items[i]; it != nil {
			it.at, it.idx = h.evTime, h.evIdx
		}
		h.ring.add(ringEntry{id: ids[i], it: items[i], at: h.evTime, idx: h.evIdx, event: true})
	}
	h.ring.add(ringEntry{id: pos})
	if pos != "" {
		h.pos, h.posTime = pos, tokenTime(b.Token, h.posTime)
	}
	all := nonNil(items)
	for s := range h.attached {
		h.deliver(s, all, h.pos)
	}
}

// attach makes the hub feed s (mu held).
func (h *Hub) attach(s *sub) {
	if s.private {
		s.private = false
		h.handovers.Add(1)
	}
	s.attached = true
	h.attached[s] = struct{}{}
}

// deliver queues what s wants of items, dropping s when they do not fit
// (mu held).
func (h *Hub) deliver(s *sub, items []*item, pos string) {
	mine := items
	if !s.filter.all() || s.cut != nil {
		mine = nil
		for _, it := range items {
			if s.filter.match(it) && (s.cut == nil || s.cut.after(it)) {
				mine = append(mine, it)
			}
		}
	}
	if s.cut != nil {
		// Handed over ahead of the hub: until the hub is past the cut,
		// its position is behind the client's.
		if !h.posTime.After(s.cut.t) {
			pos = ""
		} else {
			s.cut = nil
		}
	}
	if s.offer(mine, pos) {
		return
	}
	delete(h.attached, s)
	s.end(endLagged)
	h.dropped.Add(1)
	h.log.Info("live events: client dropped: it fell behind", "buffer", s.max, "remote", s.remote)
}

func nonNil(items []*item) []*item {
	out := make([]*item, 0, len(items))
	for _, it := range items {
		if it != nil {
			out = append(out, it)
		}
	}
	return out
}

// tokenTime is the cluster time of a token, or old when it has none.
func tokenTime(tok bson.Raw, old bson.Timestamp) bson.Timestamp {
	if t, ok := store.TokenTime(tok); ok {
		return t
	}
	return old
}

// ring remembers the hub's recent positions (every event, shown or not,
// and every batch end) with the items shown, in order. Since begin, it
// holds every event the hub published at or after floor.
type ring struct {
	ents        []ringEntry
	start, next uint64 // sequence numbers: oldest held, next to add
	index       map[string]uint64
	ready       bool
	floor       bson.Timestamp
}

type ringEntry struct {
	id    string
	it    *item // nil: not shown, or a batch end
	at    bson.Timestamp
	idx   int // among the events of cluster time at
	event bool
}

func newRing(size int) *ring {
	return &ring{ents: make([]ringEntry, size), index: make(map[string]uint64, size)}
}

// begin says the hub's stream has every event from cluster time t on.
func (r *ring) begin(t bson.Timestamp) {
	r.ready, r.floor = true, t
}

func (r *ring) add(e ringEntry) {
	size := uint64(len(r.ents))
	if e.id == "" || (r.next > r.start && r.ents[(r.next-1)%size].id == e.id) {
		return // a batch's end is its last event
	}
	if r.next-r.start == size {
		old := r.ents[r.start%size]
		if r.index[old.id] == r.start {
			delete(r.index, old.id)
		}
		if old.event && !old.at.Before(r.floor) {
			// Events of its cluster time may be left: from the next.
			r.floor = bson.Timestamp{T: old.at.T, I: old.at.I + 1}
		}
		r.start++
	}
	r.ents[r.next%size] = e
	r.index[e.id] = r.next
	r.next++
}

func (r *ring) find(id string) (uint64, bool) {
	seq, ok := r.index[id]
	return seq, ok
}

// after returns the items after seq that f wants, or false when there are
// more than limit.
func (r *ring) after(seq uint64, f *filter, limit int) ([]*item, bool) {
	return r.collect(seq+1, func(*item) bool { return true }, f, limit)
}

// afterCut returns the items after c that f wants, or false when there
// are more than limit.
func (r *ring) afterCut(c *cut, f *filter, limit int) ([]*item, bool) {
	return r.collect(r.start, c.after, f, limit)
}

func (r *ring) collect(from uint64, ok func(*item) bool, f *filter, limit int) ([]*item, bool) {
	var out []*item
	size := uint64(len(r.ents))
	for i := from; i < r.next; i++ {
		if it := r.ents[i%size].it; it != nil && ok(it) && f.match(it) {
			if len(out) == limit {
				return nil, false
			}
			out = append(out, it)
		}
	}
	return out, true
}

func (r *ring) clear() {
	clear(r.ents)
	clear(r.index)
	r.start, r.ready, r.floor = r.next, false, bson.Timestamp{}
}
