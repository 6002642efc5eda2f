package live_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/live"
)

var majority = options.Collection().SetWriteConcern(writeconcern.Majority())

func TestTransitionsQueuesAndNodesInCommitOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.serve(live.Options{})
	c := s.connect(t, "", "")
	hint := c.nextFrame(wait)
	require.Equal(t, "2000", hint.Retry, "a retry hint first")

	q := f.queue("q1")
	qe := decode[queueEv](t, c.next(), "queue")
	require.Equal(t, "insert", qe.Op)
	require.Equal(t, q.ID.Hex(), qe.ID)
	require.Equal(t, "q1", *qe.Name)
	require.Equal(t, "Demo", qe.Fields["constructor"])
	require.Equal(t, "fifo", qe.Fields["sort"])

	ids := f.insert(q.ID, 3)
	for _, id := range ids {
		c.requireTask(inserted(id, q.ID))
	}
	for _, w := range f.run(q.ID, "n1") {
		c.requireTask(w)
	}

	// The counters are not queue events; a setting is, named from the
	// hub's memory though the update does not carry the name.
	_, err := f.db.Collection(schema.CollQueues, majority).UpdateOne(ctxT(t), bson.D{{Key: "_id", Value: q.ID}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: schema.QueueCountTodo, Value: 3}, {Key: schema.QueueCountTotal, Value: 3}}}})
	require.NoError(t, err)
	four := 4
	require.NoError(t, f.st.QueueUpdate(ctxT(t), store.QueueUpdateParams{ID: q.ID, SetMaxThreads: true, MaxThreads: &four}))
	qe = decode[queueEv](t, c.next(), "queue")
	require.Equal(t, "update", qe.Op)
	require.Equal(t, "q1", *qe.Name)
	require.Equal(t, map[string]any{"maxthreads": 4.0, "threads": 4.0}, qe.Fields)

	// Nodes: an insert, no heartbeat, a drain.
	_, err = f.st.NodeUpsert(ctxT(t), store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning})
	require.NoError(t, err)
	ne := decode[nodeEv](t, c.next(), "node")
	require.Equal(t, "insert", ne.Op)
	require.Equal(t, "n1", *ne.Node)
	require.Equal(t, "running", *ne.State)
	require.False(t, *ne.Drain)
	require.Nil(t, ne.MaxThreads)
	_, err = f.st.NodeUpsert(ctxT(t), store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning})
	require.NoError(t, err)
	_, err = f.st.NodeDrain(ctxT(t), store.NodeDrainParams{Node: "n1"})
	require.NoError(t, err)
	ne = decode[nodeEv](t, c.next(), "node")
	require.Equal(t, "update", ne.Op)
	require.Equal(t, "n1", *ne.Node, "named from the hub's memory")
	require.True(t, *ne.Drain)
	require.Nil(t, ne.State, "unchanged fields are left out")

	// A move to another queue and a delete.
	q2 := f.queue("q2")
	c.next()
	_, err = f.db.Collection(schema.CollTasks, majority).UpdateOne(ctxT(t), bson.D{{Key: "_id", Value: ids[1]}},
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskQueue, Value: q2.ID}}}})
	require.NoError(t, err)
	fr := c.requireTask(want{op: "update", id: ids[1], queue: q2.ID, from: st(schema.StatusQueued), to: st(schema.StatusQueued)})
	require.Equal(t, q.ID.Hex(), *decode[taskEv](t, fr, "task").FromQueue)
	_, err = f.db.Collection(schema.CollTasks, majority).DeleteOne(ctxT(t), bson.D{{Key: "_id", Value: ids[2]}})
	require.NoError(t, err)
	c.requireTask(want{op: "delete", id: ids[2], queue: q.ID, from: st(schema.StatusQueued)})
	c.quiet(200 * time.Millisecond)
}

func TestFilters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.queue("qa"), f.queue("qb") // before the hub: their inserts are no events
	s := f.serve(live.Options{})
	byID := s.connect(t, "?queue="+a.ID.Hex(), "")
	byName := s.connect(t, "?queue=qb", "")
	both := s.connect(t, "?queue=qa,qb&types=queue", "")
	nodes := s.connect(t, "?types=node", "")
	// A name with a comma in it is that queue's, not a list of two.
	comma := f.queue("qa,qb")
	commaName := s.connect(t, "?queue="+url.QueryEscape("qa,qb"), "")
	commaTask := f.insert(comma.ID, 1)[0]

	as, bs := make([]bson.ObjectID, 2), make([]bson.ObjectID, 2)
	for i := range 2 {
		as[i], bs[i] = bson.NewObjectID(), bson.NewObjectID()
	}
	byTask := s.connect(t, "?task="+as[1].Hex()+"&task="+bs[1].Hex(), "")
	for _, ins := range []struct {
		q   bson.ObjectID
		ids []bson.ObjectID
	}{{a.ID, as}, {b.ID, bs}} {
		_, err := f.st.TaskInsertMany(ctxT(t), store.TaskInsertManyParams{Queue: ins.q, IDs: ins.ids, Parameters: make([]bson.Raw, 2)})
		require.NoError(t, err)
	}
	runA := f.run(a.ID, "n1")
	runB := f.run(b.ID, "n2")
	_, err := f.st.NodeUpsert(ctxT(t), store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning})
	require.NoError(t, err)
	rename := func(q bson.ObjectID, name string) {
		require.NoError(t, f.st.QueueUpdate(ctxT(t), store.QueueUpdateParams{ID: q, Name: &name}))
	}
	rename(a.ID, "qa2")
	lastA, lastB := f.insert(a.ID, 1)[0], f.insert(b.ID, 1)[0]
	rename(b.ID, "qb2")
	_, err = f.st.NodeDrain(ctxT(t), store.NodeDrainParams{Node: "n1"})
	require.NoError(t, err)
	moved := f.insert(a.ID, 1)[0]
	_, err = f.db.Collection(schema.CollTasks, majority).UpdateOne(ctxT(t), bson.D{{Key: "_id", Value: moved}},
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskQueue, Value: b.ID}}}})
	require.NoError(t, err)
	claim := func(q bson.ObjectID, node string) want {
		task, err := f.st.TaskClaim(ctxT(t), store.TaskClaimParams{Queue: q, Node: node, Sort: schema.SortFIFO})
		require.NoError(t, err)
		return want{op: "update", id: task.ID, queue: q, from: st(schema.StatusQueued), to: st(schema.StatusClaimed), node: node}
	}
	claimA, claimB := claim(a.ID, "n1"), claim(b.ID, "n2")
	require.Equal(t, as[1], claimA.id)
	require.Equal(t, bs[1], claimB.id)
	movedW := want{op: "update", id: moved, queue: b.ID, from: st(schema.StatusQueued), to: st(schema.StatusQueued)}

	for _, id := range as {
		byID.requireTask(inserted(id, a.ID))
	}
	for _, w := range runA {
		byID.requireTask(w)
	}
	require.Equal(t, "qa2", *decode[queueEv](t, byID.next(), "queue").Name)
	byID.requireTask(inserted(lastA, a.ID))
	byID.requireTask(inserted(moved, a.ID))
	byID.requireTask(movedW) // it left the queue: a change of the queue's tasks
	byID.requireTask(claimA)

	for _, id := range bs {
		byName.requireTask(inserted(id, b.ID))
	}
	for _, w := range runB {
		byName.requireTask(w)
	}
	byName.requireTask(inserted(lastB, b.ID))
	require.Equal(t, "qb2", *decode[queueEv](t, byName.next(), "queue").Name)
	byName.requireTask(movedW)
	byName.requireTask(claimB)

	require.Equal(t, "qa2", *decode[queueEv](t, both.next(), "queue").Name)
	require.Equal(t, "qb2", *decode[queueEv](t, both.next(), "queue").Name)

	require.Equal(t, "insert", decode[nodeEv](t, nodes.next(), "node").Op)
	require.True(t, *decode[nodeEv](t, nodes.next(), "node").Drain)

	byTask.requireTask(inserted(as[1], a.ID))
	byTask.requireTask(inserted(bs[1], b.ID))
	byTask.requireTask(claimA)
	byTask.requireTask(claimB)

	// The queue's own insert may come first: it was written just before
	// the client connected, and the hub may not have read it yet (a CI run
	// saw it).
	if fr := commaName.next(); fr.Event == "queue" {
		require.Equal(t, "qa,qb", *decode[queueEv](t, fr, "queue").Name)
		commaName.requireTask(inserted(commaTask, comma.ID))
	} else {
		ev := decode[taskEv](t, fr, "task")
		require.Equal(t, commaTask.Hex(), ev.ID, "%v", fr)
		require.Equal(t, "insert", ev.Op, "%v", fr)
	}

	for _, c := range []*client{byID, byName, both, nodes, byTask, commaName} {
		c.quiet(100 * time.Millisecond)
	}
}

// ids returns the ids of frames.
func idsOf(frs []frame) []string {
	out := make([]string, len(frs))
	for i, fr := range frs {
		out[i] = fr.ID
	}
	return out
}

func TestResumeAfterARestartLosesAndRepeatsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s1 := f.serve(live.Options{})
	c1 := s1.connect(t, "?queue=q", "")
	first := f.insert(q.ID, 10)
	var got []frame
	for _, id := range first {
		got = append(got, c1.requireTask(inserted(id, q.ID)))
	}
	resumeAt := got[3]

	// The server stops: the stream ends; changes go on meanwhile.
	s1.hub.Stop()
	c1.requireEnd(wait)
	runs := f.run(q.ID, "n1")
	more := f.insert(q.ID, 5)

	// A new server: the client resumes after the fourth event.
	s2 := f.serve(live.Options{})
	c2 := s2.connect(t, "?queue=q", resumeAt.ID)
	for _, id := range first[4:] {
		c2.requireTask(inserted(id, q.ID))
	}
	for _, w := range runs {
		c2.requireTask(w)
	}
	for _, id := range more {
		c2.requireTask(inserted(id, q.ID))
	}
	// Changes keep coming while the replay catches up and hands the
	// client over to the hub: none lost, none twice.
	var wants []want
	for range 40 {
		for _, id := range f.insert(q.ID, 1) {
			wants = append(wants, inserted(id, q.ID))
		}
	}
	for _, w := range wants {
		c2.requireTask(w)
	}
	eventually(t, func() bool { return s2.hub.Stats().Replaying == 0 }, wait, "the replay hands over")
	require.Equal(t, int64(1), s2.hub.Stats().Handovers)
	last := f.insert(q.ID, 3)
	for _, id := range last {
		c2.requireTask(inserted(id, q.ID))
	}
	c2.quiet(100 * time.Millisecond)
}

func TestResumeFromARecentIDIsServedByTheHub(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s := f.serve(live.Options{})
	c := s.connect(t, "?queue="+q.ID.Hex(), "")
	ids := f.insert(q.ID, 5)
	var frs []frame
	for _, id := range ids {
		frs = append(frs, c.requireTask(inserted(id, q.ID)))
	}
	c.close()
	c2 := s.connect(t, "?queue="+q.ID.Hex()+"&last_event_id="+frs[0].ID, frs[1].ID) // the header wins
	require.Zero(t, s.hub.Stats().Replaying, "no replay for a position the hub remembers")
	for _, id := range ids[2:] {
		c2.requireTask(inserted(id, q.ID))
	}
	next := f.insert(q.ID, 1)[0]
	c2.requireTask(inserted(next, q.ID))
	c2.quiet(100 * time.Millisecond)
	require.Zero(t, s.hub.Stats().Handovers)

	// The query parameter, for clients that cannot set headers.
	c3 := s.connect(t, "?queue="+q.ID.Hex()+"&last_event_id="+frs[3].ID, "")
	c3.requireTask(inserted(ids[4], q.ID))
	c3.requireTask(inserted(next, q.ID))
	c3.quiet(100 * time.Millisecond)
}

func TestKeepAliveCarriesThePosition(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.queue("a"), f.queue("b")
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	s := f.serve(live.Options{Clock: fake, KeepAlive: 30 * time.Second})
	c := s.connect(t, "?queue=a", "")
	c.nextFrame(wait) // retry hint
	require.NoError(t, fake.BlockUntil(ctxT(t), 1))
	fake.Advance(30 * time.Second)
	ka := c.nextFrame(wait)
	require.Equal(t, []string{"keep-alive"}, ka.Comments)
	require.Empty(t, ka.Event)

	// Events of another queue: the client's position moves past them
	// with the next keep-alive's id, and a resume from it starts after
	// them.
	f.insert(b.ID, 3)
	aid := f.insert(a.ID, 1)[0]
	c.requireTask(inserted(aid, a.ID))
	f.insert(b.ID, 2)
	eventually(t, func() bool {
		fake.Advance(30 * time.Second)
		select {
		case fr := <-c.frames:
			require.Empty(t, fr.Event, "%v", fr)
			if fr.HasID {
				c.lastID = fr.ID
				return true
			}
		case <-time.After(50 * time.Millisecond):
		}
		return false
	}, wait, "a keep-alive with an id")
	c.close()

	c2 := s.connect(t, "?queue=a", c.lastID)
	next := f.insert(a.ID, 1)[0]
	c2.requireTask(inserted(next, a.ID))
	c2.quiet(100 * time.Millisecond)
}

// futureID is the id of a position no deployment has reached yet.
func futureID() string {
	tok, _ := bson.Marshal(bson.D{{Key: "_data", Value: "82FFFFFF00000000012B0229296E04"}})
	return base64.RawURLEncoding.EncodeToString(tok)
}

func TestALostPositionIsAReset(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s := f.serve(live.Options{})
	c := s.connect(t, "", futureID())
	fr := c.next()
	require.Equal(t, "reset", fr.Event)
	require.NotEmpty(t, fr.ID, "the position the stream goes on from")
	var reset struct{ Type, Reason, Message string }
	require.NoError(t, json.Unmarshal([]byte(fr.Data), &reset))
	require.Equal(t, "reset", reset.Type)
	require.Contains(t, reset.Reason, "change history lost")
	require.NotEmpty(t, reset.Message)
	ids := f.insert(q.ID, 2)
	for _, id := range ids {
		c.requireTask(inserted(id, q.ID))
	}
	require.Equal(t, int64(1), s.hub.Stats().Resets)
}

// slowWriter is a client that stops reading: once open is false, writes
// block until released or until their deadline.
type slowWriter struct {
	mu       sync.Mutex
	hdr      http.Header
	buf      strings.Builder
	open     bool
	allow    int // writes to let through before open turns false (0: no limit)
	writes   int
	release  chan struct{}
	deadline time.Time
}

func (w *slowWriter) Header() http.Header { return w.hdr }
func (w *slowWriter) WriteHeader(int)     {}
func (w *slowWriter) Flush()              {}

func (w *slowWriter) Write(p []byte) (int, error) {
	for {
		w.mu.Lock()
		open, dl := w.open, w.deadline
		w.mu.Unlock()
		if !dl.IsZero() && time.Now().After(dl) {
			return 0, context.DeadlineExceeded
		}
		if open {
			w.mu.Lock()
			w.writes++
			if w.writes == w.allow {
				w.open = false
			}
			w.mu.Unlock()
			break
		}
		select {
		case <-w.release:
			w.mu.Lock()
			w.open = true
			w.mu.Unlock()
		case <-time.After(5 * time.Millisecond): // a new deadline?
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.WriteString(string(p))
}

func (w *slowWriter) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deadline = t
	return nil
}

func (w *slowWriter) SetReadDeadline(time.Time) error { return nil }

func (w *slowWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestASlowClientIsDroppedAndSlowsNobody(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s := f.serve(live.Options{Buffer: 64, WriteTimeout: time.Hour})
	fast := s.connect(t, "", "")
	slow := &slowWriter{hdr: http.Header{}, open: true, release: make(chan struct{})}
	release, served := serveSlowly(t, s, slow)
	eventually(t, func() bool { return s.hub.Stats().Subscribers == 2 }, wait, "two subscribers")
	first := f.insert(q.ID, 1)[0]
	fast.requireTask(inserted(first, q.ID))
	eventually(t, func() bool { return strings.Contains(slow.String(), first.Hex()) }, wait, "the slow client got the first event")
	slow.mu.Lock()
	slow.open = false
	slow.mu.Unlock()

	var wants []want
	for range 12 { // one write blocks, then the buffer overflows
		for _, id := range f.insert(q.ID, 10) {
			wants = append(wants, inserted(id, q.ID))
		}
	}
	for _, w := range wants {
		fast.requireTask(w)
	}
	out, resume := droppedLagged(t, s, slow, release, served)
	require.Equal(t, 1, s.hub.Stats().Subscribers, "the slow client is gone")
	require.NotEmpty(t, resume)

	// The client had the first k of wants; resuming from the id it was
	// given goes on with exactly the rest.
	k := countIn(out, hexes(wants))
	require.Contains(t, out, "id: "+resume+"\n", "the resume id is the last the client was sent")
	c := s.connect(t, "", resume)
	for _, w := range wants[k:] {
		c.requireTask(w)
	}
	c.quiet(100 * time.Millisecond)
}

// serveSlowly serves the hub's events to slow in a goroutine: release
// lets its writes go (at the test's end too), served is closed once the
// handler has returned.
func serveSlowly(t *testing.T, s *server, slow *slowWriter) (release func(), served <-chan struct{}) {
	t.Helper()
	var once sync.Once
	release = func() { once.Do(func() { close(slow.release) }) }
	t.Cleanup(release)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.hub.ServeHTTP(slow, httptest.NewRequest(http.MethodGet, "/api/v1/events", nil))
	}()
	return release, done
}

// droppedLagged waits until the hub drops the slow client, lets its writes
// go, waits for its handler, and returns what it was sent and the resume
// id of the lagged event that ends it.
func droppedLagged(t *testing.T, s *server, slow *slowWriter, release func(), served <-chan struct{}) (out, resume string) {
	t.Helper()
	eventually(t, func() bool { return s.hub.Stats().Dropped == 1 }, wait, "the slow client is dropped")
	release()
	select {
	case <-served:
	case <-time.After(wait):
		t.Fatal("the dropped client's handler did not return")
	}
	out = slow.String()
	require.Contains(t, out, "event: lagged\ndata: {\"type\":\"lagged\"")
	var lagged struct{ Resume string }
	data := out[strings.LastIndex(out, "data: ")+len("data: "):]
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(data)), &lagged))
	return out, lagged.Resume
}

func hexes(ws []want) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.id.Hex()
	}
	return out
}

func countIn(out string, ids []string) int {
	n := 0
	for _, id := range ids {
		if strings.Contains(out, id) {
			n++
		}
	}
	return n
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := f.serve(live.Options{})
	noNames := f.serve(live.Options{Lookup: nilLookup{}})
	for _, tc := range []struct {
		srv    *server
		path   string
		last   string
		status int
		field  string
	}{
		{s, "?queue=nosuchqueue", "", 400, "queue"},
		{s, "?queue=" + bson.NewObjectID().Hex() + ",", "zzz", 400, "Last-Event-ID"},
		{s, "?last_event_id=%21%21", "", 400, "last_event_id"},
		{s, "?last_event_id=" + base64.RawURLEncoding.EncodeToString([]byte("not bson")), "", 400, "last_event_id"},
		{s, "?task=123", "", 400, "task"},
		{s, "?types=task,tasks", "", 400, "types"},
		{s, "?types=", "", 400, "types"},
		{noNames, "?queue=q", "", 400, "queue"},
	} {
		resp, cancel := tc.srv.get(t, tc.path, tc.last)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		require.NoError(t, err)
		require.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.path, body)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		var e struct {
			Error struct{ Code, Message, Field string }
		}
		require.NoError(t, json.Unmarshal(body, &e), "%s", body)
		require.Equal(t, "invalid_parameter", e.Error.Code, "%s", body)
		require.Equal(t, tc.field, e.Error.Field, "%s: %s", tc.path, body)
		require.NotEmpty(t, e.Error.Message)
	}

	resp, err := s.srv.Client().Post(s.srv.URL, "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// Not running: 503, through OnError when given.
	var seen []*live.Error
	hub := live.New(live.Options{Store: f.st, OnError: func(w http.ResponseWriter, _ *http.Request, err *live.Error) {
		seen = append(seen, err)
		live.WriteError(w, err)
	}})
	rec := httptest.NewRecorder()
	hub.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/events", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Len(t, seen, 1)
	require.Equal(t, live.CodeUnavailable, seen[0].Code)
	require.JSONEq(t, `{"error":{"code":"unavailable","message":"`+seen[0].Message+`","field":null}}`, rec.Body.String())
}

// nilLookup is a server without queue names: a nil Lookup in the options
// means the store, so a Lookup that knows nothing stands for it.
type nilLookup struct{ live.Lookup }

func (nilLookup) QueueGet(context.Context, store.QueueGetParams) (schema.Queue, error) {
	return schema.Queue{}, store.ErrNotFound
}
func (nilLookup) QueueList(context.Context) (store.QueueListResult, error) {
	return store.QueueListResult{}, nil
}
func (nilLookup) NodeList(context.Context) (store.NodeListResult, error) {
	return store.NodeListResult{}, nil
}

func TestTheServersTimeoutsDoNotCutTheStream(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	hub := live.New(live.Options{Store: f.st, MaxAwait: 100 * time.Millisecond})
	require.NoError(t, hub.Start(ctxT(t)))
	srv := httptest.NewUnstartedServer(hub)
	// A second each (at 200 ms, a stream's start delayed on a loaded
	// machine could lose to them before lifting them), outlived below.
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = time.Second, time.Second
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(hub.Stop)
	s := &server{hub: hub, srv: srv}
	c := s.connect(t, "", "")
	time.Sleep(2500 * time.Millisecond)
	ids := f.insert(q.ID, 1)
	c.requireTask(inserted(ids[0], q.ID))
}

func TestStopEndsEveryStreamAndLeavesNoCursor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s := f.serve(live.Options{})
	live1 := s.connect(t, "", "")
	ids := f.insert(q.ID, 3)
	var frs []frame
	for _, id := range ids {
		frs = append(frs, live1.requireTask(inserted(id, q.ID)))
	}
	// A resumed client on a replay of its own, which cannot hand it over
	// to the hub: it stopped reading, so the replay waits for room.
	s2 := f.serve(live.Options{Buffer: 2})
	more := f.insert(q.ID, 10)
	slow := &slowWriter{hdr: http.Header{}, open: true, allow: 1, release: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		req := httptest.NewRequest(http.MethodGet, "/api/v1/events", nil)
		req.Header.Set("Last-Event-ID", frs[0].ID)
		s2.hub.ServeHTTP(slow, req)
	}()
	eventually(t, func() bool { return s2.hub.Stats().Replaying == 1 }, wait, "a replay")
	for _, id := range more {
		live1.requireTask(inserted(id, q.ID))
	}
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, 1, s2.hub.Stats().Replaying, "the replay cannot hand over a client that does not read")
	require.NotEmpty(t, mongotest.ChangeStreamCursors(t, f.db))

	stopped := make(chan struct{})
	go func() {
		s.hub.Stop()
		s2.hub.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatal("Stop did not return")
	}
	live1.requireEnd(wait)
	select {
	case <-served:
	case <-time.After(wait):
		t.Fatal("the replaying client's handler did not return")
	}
	noCursors(t, f.db)

	resp, cancel := s.get(t, "", "")
	defer cancel()
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

func TestLifecycle(t *testing.T) {
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	lifecycletest.Check(t, func(*testing.T) lifecycle.Service {
		return live.New(live.Options{Store: st, Lookup: st, MaxAwait: 50 * time.Millisecond})
	}, lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()})
	noCursors(t, db)
}

// noCursors requires that no change stream cursor is left on db: soon,
// not the ten minutes one left behind stays (a getMore being killed may
// take a loaded server seconds to notice), and still after the longest
// time the server holds a getMore.
func noCursors(t *testing.T, db *mongo.Database) {
	t.Helper()
	require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 0 }, 30*time.Second, 10*time.Millisecond,
		"change stream cursors left open")
	time.Sleep(300 * time.Millisecond)
	require.Empty(t, mongotest.ChangeStreamCursors(t, db))
}

// TestResumesUnderLoadAreExact resumes clients from many points of a
// stream while tasks are inserted and claimed, a transaction's worth at a
// time (events sharing one cluster time, split across batches): each gets
// exactly what a client connected all along got after that point, and is
// handed over to the hub.
func TestResumesUnderLoadAreExact(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s := f.serveWith(live.Options{History: 40, Buffer: 1 << 20}, func(h *live.Hub) { live.SetMaxBatch(h, 7) })
	ref := s.connect(t, "?types=task", "")

	// The load stops between writes, never within one: a cancelled write
	// may still commit, after the marker below.
	ctx := ctxT(t)
	var stop atomic.Bool
	defer stop.Store(true)
	loaded := make(chan error, 1)
	go func() {
		loaded <- func() error {
			for !stop.Load() {
				ids, err := f.st.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: make([]bson.Raw, 10)})
				if err != nil {
					return err
				}
				sess, err := f.db.Client().StartSession()
				if err != nil {
					return err
				}
				_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
					return f.db.Collection(schema.CollTasks, majority).UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
						bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}, {Key: schema.TaskNode, Value: "tx"}}}})
				})
				sess.EndSession(context.Background())
				if err != nil {
					return err
				}
			}
			return nil
		}()
	}()

	var frs []frame
	read := func(n int) {
		for len(frs) < n {
			frs = append(frs, ref.next())
		}
	}
	type resumer struct {
		at int
		c  *client
	}
	var rs []resumer
	for i, at := range []int{0, 5, 60, 200, 390, 399, 700} {
		// Some from a recent position (the hub's ring), most from an
		// older one (a replay).
		read(at + 1 + 300*(i%3))
		rs = append(rs, resumer{at, s.connect(t, "?types=task", frs[at].ID)})
	}
	read(1500)
	stop.Store(true)
	require.NoError(t, <-loaded)
	marker := f.insert(q.ID, 1)[0]
	for {
		fr := ref.next()
		frs = append(frs, fr)
		if strings.Contains(fr.Data, marker.Hex()) {
			break
		}
	}
	for _, r := range rs {
		want := frs[r.at+1:]
		for i, w := range want {
			got := r.c.next()
			require.Equal(t, w.Data, got.Data, "resumed after event %d: event %d of %d", r.at, i, len(want))
		}
		r.c.quiet(50 * time.Millisecond)
	}
	st := s.hub.Stats()
	require.Zero(t, st.Replaying, "every replay handed over: %+v", st)
	require.Positive(t, st.Handovers, "%+v", st)
	require.Zero(t, st.Dropped)
	t.Logf("%d events; %+v", len(frs), st)
}

// TestAClientDroppedBeforeItsFirstEventResumesWithoutLoss: a client that
// gave no position is told the hub's as it joins (an id with the retry
// line), so one dropped before any event reached it is given a resume id
// all the same, and resuming there misses nothing.
func TestAClientDroppedBeforeItsFirstEventResumesWithoutLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("q")
	s := f.serve(live.Options{Buffer: 16, WriteTimeout: time.Hour})
	f.insert(q.ID, 1) // the hub has a position
	eventually(t, func() bool { return s.hub.Stats().Published > 0 }, wait, "the hub published nothing")
	// Its first write (the retry and id lines) waits until it is dropped.
	slow := &slowWriter{hdr: http.Header{}, release: make(chan struct{})}
	release, served := serveSlowly(t, s, slow)
	eventually(t, func() bool { return s.hub.Stats().Subscribers == 1 }, wait, "the client never joined")

	var wants []want
	for range 4 { // the buffer overflows
		for _, id := range f.insert(q.ID, 10) {
			wants = append(wants, inserted(id, q.ID))
		}
	}
	out, resume := droppedLagged(t, s, slow, release, served)
	require.NotEmpty(t, resume, "a client dropped before its first event is given no resume id:\n%s", out)
	require.True(t, strings.HasPrefix(out, "id: "+resume+"\n") || strings.Contains(out, "\nid: "+resume+"\n"),
		"the resume id is the one it was given as it joined:\n%s", out)
	require.Zero(t, countIn(out, hexes(wants)), "events reached the client before it was dropped")
	c := s.connect(t, "", resume)
	for _, w := range wants {
		c.requireTask(w)
	}
	c.quiet(100 * time.Millisecond)
}
