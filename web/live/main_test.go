package live_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/live"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

// wait bounds the wait for an event that should come.
const wait = 15 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// fixture is a database, its store, and hubs served over HTTP.
type fixture struct {
	t  *testing.T
	db *mongo.Database
	st *store.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	require.NoError(t, st.TasksPreImagesEnable(ctxT(t)))
	return &fixture{t: t, db: db, st: st}
}

// server is a started hub behind an httptest server.
type server struct {
	hub *live.Hub
	srv *httptest.Server
}

// serve starts a hub over the fixture's store (Store and Lookup set unless
// given) and serves it; both stop after the test (the hub first: the
// test server's Close waits for the streams).
func (f *fixture) serve(opts live.Options) *server {
	f.t.Helper()
	return f.serveWith(opts, nil)
}

// serveWith is serve, with prepare called on the hub before Start.
func (f *fixture) serveWith(opts live.Options, prepare func(*live.Hub)) *server {
	f.t.Helper()
	if opts.Store == nil {
		opts.Store = f.st
	}
	if opts.Lookup == nil {
		opts.Lookup = f.st
	}
	if opts.MaxAwait == 0 {
		opts.MaxAwait = 100 * time.Millisecond
	}
	hub := live.New(opts)
	if prepare != nil {
		prepare(hub)
	}
	require.NoError(f.t, hub.Start(ctxT(f.t)))
	srv := httptest.NewServer(hub)
	f.t.Cleanup(srv.Close)
	f.t.Cleanup(hub.Stop)
	return &server{hub: hub, srv: srv}
}

// frame is one block of the stream, up to a blank line.
type frame struct {
	ID       string
	HasID    bool
	Event    string
	Data     string
	Retry    string
	Comments []string
}

func (fr frame) String() string {
	return fmt.Sprintf("{id:%.12s… event:%s data:%s comments:%v}", fr.ID, fr.Event, fr.Data, fr.Comments)
}

// client reads one event stream.
type client struct {
	t      *testing.T
	resp   *http.Response
	cancel context.CancelFunc
	frames chan frame
	done   chan struct{} // closed when the stream ended
	err    error         // why, once done
	lastID string        // as a browser keeps it
}

// connect opens a stream at path ("?queue=…"), with Last-Event-ID when
// last is not "", and returns once the response headers arrived (the
// subscription is live then).
func (s *server) connect(t *testing.T, path, last string) *client {
	t.Helper()
	resp, cancel := s.get(t, path, last)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	require.Equal(t, "no", resp.Header.Get("X-Accel-Buffering"))
	c := &client{t: t, resp: resp, cancel: cancel, frames: make(chan frame, 100000), done: make(chan struct{}), lastID: last}
	go c.read()
	t.Cleanup(c.close)
	return c
}

func (s *server) get(t *testing.T, path, last string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.srv.URL+path, nil)
	require.NoError(t, err)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		cancel()
	}
	require.NoError(t, err)
	return resp, cancel
}

func (c *client) close() {
	c.cancel()
	<-c.done
}

// read parses the stream (the SSE rules, simplified: the fields this
// server writes).
func (c *client) read() {
	defer close(c.done)
	defer c.resp.Body.Close()
	sc := bufio.NewScanner(c.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var fr frame
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			c.frames <- fr
			fr = frame{}
			continue
		}
		if strings.HasPrefix(line, ":") {
			fr.Comments = append(fr.Comments, strings.TrimSpace(line[1:]))
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			fr.ID, fr.HasID = value, true
		case "event":
			fr.Event = value
		case "data":
			if fr.Data != "" {
				fr.Data += "\n"
			}
			fr.Data += value
		case "retry":
			fr.Retry = value
		default:
			c.err = fmt.Errorf("unknown field in line %q", line)
			return
		}
	}
	c.err = sc.Err()
}

// nextFrame returns the next block, failing the test after d.
func (c *client) nextFrame(d time.Duration) frame {
	c.t.Helper()
	select {
	case fr := <-c.frames:
		if fr.HasID {
			c.lastID = fr.ID
		}
		return fr
	case <-time.After(d):
		c.t.Fatalf("no frame within %v (stream ended: %v)", d, c.ended())
		return frame{}
	}
}

// next returns the next event (skipping retry hints and keep-alives).
func (c *client) next() frame {
	c.t.Helper()
	for {
		fr := c.nextFrame(wait)
		if fr.Event != "" {
			return fr
		}
	}
}

// quiet requires that no event comes within d.
func (c *client) quiet(d time.Duration) {
	c.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case fr := <-c.frames:
			if fr.Event != "" {
				c.t.Fatalf("unexpected event %v", fr)
			}
		case <-deadline:
			return
		}
	}
}

// ended reports whether the stream ended.
func (c *client) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// requireEnd waits for the end of the stream, returning the events still
// read.
func (c *client) requireEnd(d time.Duration) []frame {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(d):
		c.t.Fatalf("the stream did not end within %v", d)
	}
	var out []frame
	for {
		select {
		case fr := <-c.frames:
			if fr.Event != "" {
				out = append(out, fr)
			}
		default:
			return out
		}
	}
}

// taskEv is the data of a task event.
type taskEv struct {
	Type        string  `json:"type"`
	Op          string  `json:"op"`
	ID          string  `json:"id"`
	Queue       *string `json:"queue"`
	FromQueue   *string `json:"from_queue"`
	From        *int    `json:"from"`
	To          *int    `json:"to"`
	Node        *string `json:"node"`
	Time        string  `json:"time"`
	ClusterTime *struct {
		T uint32 `json:"t"`
		I uint32 `json:"i"`
	} `json:"cluster_time"`
}

type queueEv struct {
	Type    string         `json:"type"`
	Op      string         `json:"op"`
	ID      string         `json:"id"`
	Name    *string        `json:"name"`
	Fields  map[string]any `json:"fields"`
	Removed []string       `json:"removed"`
}

type nodeEv struct {
	Type       string  `json:"type"`
	Op         string  `json:"op"`
	ID         string  `json:"id"`
	Node       *string `json:"node"`
	State      *string `json:"state"`
	Drain      *bool   `json:"drain"`
	MaxThreads *int    `json:"maxthreads"`
	Dead       *bool   `json:"dead"`
}

func decode[T any](t *testing.T, fr frame, event string) T {
	t.Helper()
	require.Equal(t, event, fr.Event, "%v", fr)
	require.NotContains(t, fr.Data, "\n")
	var v T
	require.NoError(t, json.Unmarshal([]byte(fr.Data), &v), fr.Data)
	return v
}

// want is an expected task transition.
type want struct {
	op       string
	id       bson.ObjectID
	queue    bson.ObjectID
	from, to *int
	node     string // "" for null
}

func st(s schema.Status) *int { n := int(s); return &n }

// requireTask reads the next event and checks it is w.
func (c *client) requireTask(w want) frame {
	c.t.Helper()
	fr := c.next()
	ev := decode[taskEv](c.t, fr, "task")
	require.Equal(c.t, "task", ev.Type)
	require.Equal(c.t, w.op, ev.Op, "%v", fr)
	require.Equal(c.t, w.id.Hex(), ev.ID, "%v", fr)
	require.NotNil(c.t, ev.Queue, "%v", fr)
	require.Equal(c.t, w.queue.Hex(), *ev.Queue, "%v", fr)
	require.Equal(c.t, w.from, ev.From, "from: %v", fr)
	require.Equal(c.t, w.to, ev.To, "to: %v", fr)
	if w.node == "" {
		require.Nil(c.t, ev.Node, "%v", fr)
	} else {
		require.NotNil(c.t, ev.Node, "%v", fr)
		require.Equal(c.t, w.node, *ev.Node, "%v", fr)
	}
	require.NotEmpty(c.t, fr.ID)
	tm, err := time.Parse(time.RFC3339Nano, ev.Time)
	require.NoError(c.t, err)
	require.WithinDuration(c.t, time.Now(), tm, time.Minute)
	require.NotNil(c.t, ev.ClusterTime)
	require.NotZero(c.t, ev.ClusterTime.T)
	return fr
}

// inserted is the want of a task insert.
func inserted(id, q bson.ObjectID) want {
	return want{op: "insert", id: id, queue: q, to: st(schema.StatusQueued)}
}

func (f *fixture) queue(name string) schema.Queue {
	f.t.Helper()
	q, err := f.st.QueueCreate(ctxT(f.t), store.QueueCreateParams{Name: name, Constructor: "Demo", Sort: schema.SortFIFO})
	require.NoError(f.t, err)
	return q
}

func (f *fixture) insert(q bson.ObjectID, n int) []bson.ObjectID {
	f.t.Helper()
	ids, err := f.st.TaskInsertMany(ctxT(f.t), store.TaskInsertManyParams{Queue: q, Parameters: make([]bson.Raw, n)})
	require.NoError(f.t, err)
	return ids
}

// run claims the next task of q as node, starts and finishes it, and
// returns the wants of the three transitions.
func (f *fixture) run(q bson.ObjectID, node string) []want {
	f.t.Helper()
	ctx := ctxT(f.t)
	task, err := f.st.TaskClaim(ctx, store.TaskClaimParams{Queue: q, Node: node, Sort: schema.SortFIFO})
	require.NoError(f.t, err)
	require.NoError(f.t, f.st.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: node}))
	require.NoError(f.t, f.st.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: node, Status: schema.StatusSucceeded, Stdout: "ok"}))
	return []want{
		{op: "update", id: task.ID, queue: q, from: st(schema.StatusQueued), to: st(schema.StatusClaimed), node: node},
		{op: "update", id: task.ID, queue: q, from: st(schema.StatusClaimed), to: st(schema.StatusRunning), node: node},
		{op: "update", id: task.ID, queue: q, from: st(schema.StatusRunning), to: st(schema.StatusSucceeded), node: node},
	}
}

// eventually polls cond until it holds, failing the test after d.
func eventually(t *testing.T, cond func() bool, d time.Duration, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
