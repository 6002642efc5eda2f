package metrics

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gather returns m's families by name.
func gather(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := m.Registry().Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// find returns the metric of family name whose labels are exactly labels
// (name, value pairs), or nil.
func find(mfs map[string]*dto.MetricFamily, name string, labels ...string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a counter's or gauge's value; it fails the test when absent.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	m := find(mfs, name, labels...)
	require.NotNil(t, m, "%s%v is absent", name, labels)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s%v is neither a counter nor a gauge", name, labels)
	return 0
}

func TestObserver(t *testing.T) {
	m := New()
	m.TaskClaimed("q1")
	m.TaskClaimed("q1")
	m.TaskClaimed("q2")
	m.TaskStarted("q1", 3*time.Millisecond)
	m.TaskStarted("q1", -time.Second) // the submitter's clock ahead: 0
	m.TaskStarted("q2", 2*time.Minute)
	m.TaskFinished("q1", schema.StatusSucceeded, 1500*time.Millisecond, false)
	m.TaskFinished("q1", schema.StatusFailed, 10*time.Millisecond, false)
	m.TaskFinished("q1", schema.StatusFailed, 20*time.Millisecond, true) // retried: ran, not finished
	m.TaskFinished("q2", schema.Status(7), time.Hour, false)

	mfs := gather(t, m)
	require.Equal(t, 2.0, value(t, mfs, "disbatch_tasks_claimed_total", "queue", "q1"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_tasks_claimed_total", "queue", "q2"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_tasks_finished_total", "queue", "q1", "status", "1"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_tasks_finished_total", "queue", "q1", "status", "2"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_tasks_finished_total", "queue", "q2", "status", "7"))
	require.Nil(t, find(mfs, "disbatch_tasks_finished_total", "queue", "q2", "status", "1"))

	require.Equal(t, dto.MetricType_HISTOGRAM, mfs["disbatch_task_pickup_seconds"].GetType())
	h := find(mfs, "disbatch_task_pickup_seconds", "queue", "q1").GetHistogram()
	require.NotNil(t, h)
	require.Equal(t, uint64(2), h.GetSampleCount())
	require.InDelta(t, 0.003, h.GetSampleSum(), 1e-9)
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
		switch b.GetUpperBound() {
		case 0.001, 0.002: // the clamped 0 only
			require.Equal(t, uint64(1), b.GetCumulativeCount(), "le=%v", b.GetUpperBound())
		case 0.003, 60: // 3 ms falls in le=0.003
			require.Equal(t, uint64(2), b.GetCumulativeCount(), "le=%v", b.GetUpperBound())
		}
	}
	require.Equal(t, PickupBuckets, bounds)
	require.Equal(t, 0.001, bounds[0])
	require.Equal(t, 60.0, bounds[len(bounds)-1])
	below100ms := 0
	for _, b := range bounds {
		if b <= 0.1 {
			below100ms++
		}
	}
	require.GreaterOrEqual(t, below100ms, len(bounds)/2, "the pickup buckets are dense below 100 ms")
	// 2 minutes is beyond the last bucket: counted, in +Inf only.
	h2 := find(mfs, "disbatch_task_pickup_seconds", "queue", "q2").GetHistogram()
	require.Equal(t, uint64(1), h2.GetSampleCount())
	require.Equal(t, uint64(0), h2.GetBucket()[len(h2.GetBucket())-1].GetCumulativeCount())

	run := find(mfs, "disbatch_task_run_seconds", "queue", "q1").GetHistogram()
	require.Equal(t, uint64(3), run.GetSampleCount(), "a retried attempt ran too")
	require.InDelta(t, 1.53, run.GetSampleSum(), 1e-9)

	// The Go and process collectors are there; nothing from a node yet.
	require.Contains(t, mfs, "go_goroutines")
	require.Contains(t, mfs, "process_cpu_seconds_total")
	require.NotContains(t, mfs, "disbatch_claims_total")
	require.NotContains(t, mfs, "disbatch_queue_tasks")

	// Its own registry: nothing lands in the global one.
	global, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range global {
		require.False(t, strings.HasPrefix(mf.GetName(), "disbatch_"), mf.GetName())
	}
}

type fakeSource struct {
	queues    []schema.Queue
	running   map[bson.ObjectID]int
	claimer   claimer.Stats
	stream    events.Stats
	projector projections.Stats
	fenced    bool
	draining  bool
	leader    leadership.Status
}

func (f *fakeSource) Queues() []schema.Queue            { return f.queues }
func (f *fakeSource) Running(q bson.ObjectID) int       { return f.running[q] }
func (f *fakeSource) ClaimerStats() claimer.Stats       { return f.claimer }
func (f *fakeSource) StreamStats() events.Stats         { return f.stream }
func (f *fakeSource) ProjectorStats() projections.Stats { return f.projector }
func (f *fakeSource) Fenced() bool                      { return f.fenced }
func (f *fakeSource) Draining() bool                    { return f.draining }
func (f *fakeSource) LeaderStatus() leadership.Status   { return f.leader }

func ptr[T any](v T) *T { return &v }

func TestCollector(t *testing.T) {
	a, b, c, d1, d2, gone := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	e, f1, f2, g := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	src := &fakeSource{
		queues: []schema.Queue{
			{ID: a, Name: "alpha", CountTodo: ptr[int64](3), CountTotal: ptr[int64](10), CountRunning: ptr[int64](3), CountFailed: ptr[int64](2)},
			{ID: b, Name: "beta"}, // no counters yet
			{ID: c, Name: "gamma", CountTodo: ptr[int64](0), CountTotal: ptr[int64](0), CountRunning: ptr[int64](0), CountFailed: ptr[int64](0)},
			// Two queues may share a name: added up, never collected twice.
			{ID: d1, Name: "twin", CountTodo: ptr[int64](1), CountTotal: ptr[int64](2), CountRunning: ptr[int64](1), CountFailed: ptr[int64](1)},
			{ID: d2, Name: "twin", CountTodo: ptr[int64](4), CountTotal: ptr[int64](8), CountRunning: ptr[int64](2), CountFailed: ptr[int64](3)},
			// From before count_running: todo and done, no running yet.
			{ID: e, Name: "older", CountTodo: ptr[int64](6), CountTotal: ptr[int64](6)},
			// Same-named, one without count_running and count_failed: no
			// running or failed sum.
			{ID: f1, Name: "half", CountTodo: ptr[int64](1), CountTotal: ptr[int64](1), CountRunning: ptr[int64](1), CountFailed: ptr[int64](0)},
			{ID: f2, Name: "half", CountTodo: ptr[int64](1), CountTotal: ptr[int64](1)},
			// From before count_failed: running, no failed yet.
			{ID: g, Name: "recent", CountTodo: ptr[int64](2), CountTotal: ptr[int64](5), CountRunning: ptr[int64](1)},
		},
		running: map[bson.ObjectID]int{a: 2, b: 1, d1: 1, d2: 1},
		claimer: claimer.Stats{Claims: 42, WakePasses: 30, TickPasses: 5, EmptyClaims: 9, Batches: 3, Contended: 11, Lingers: 7, LingersTimedOut: 2},
		stream:  events.Stats{Events: 100, Resumes: 2, Rescans: 1, Quiets: 3},
		projector: projections.Stats{Leader: true, Events: 77, DriftQueues: 0, Reconciles: 12, RecountFailures: 2, LagP50: 40 * time.Millisecond, LagP99: 75 * time.Millisecond,
			Reasons: map[projections.ReasonKey]int64{
				{Queue: a, Reason: "cancelled"}: 4, {Queue: a, Reason: "retrying"}: 2,
				{Queue: d1, Reason: "killed"}: 1, {Queue: d2, Reason: "killed"}: 2,
				{Queue: gone, Reason: "timeout"}: 5,
			}},
	}
	m := New()
	m.Attach(src)
	mfs := gather(t, m)

	require.Equal(t, 3.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "todo"))
	require.Equal(t, 7.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "done"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "beta", "state", "todo"), "no counters: no gauge")
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "beta", "state", "done"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_queue_tasks", "queue", "gamma", "state", "todo"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_queue_tasks", "queue", "gamma", "state", "done"))
	require.Equal(t, 5.0, value(t, mfs, "disbatch_queue_tasks", "queue", "twin", "state", "todo"))
	require.Equal(t, 5.0, value(t, mfs, "disbatch_queue_tasks", "queue", "twin", "state", "done"))
	require.Equal(t, dto.MetricType_GAUGE, mfs["disbatch_queue_tasks"].GetType())
	// count_running, cluster-wide, beside this node's own running tasks.
	require.Equal(t, 3.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "running"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "beta", "state", "running"), "no counters: no gauge")
	require.Equal(t, 0.0, value(t, mfs, "disbatch_queue_tasks", "queue", "gamma", "state", "running"))
	require.Equal(t, 3.0, value(t, mfs, "disbatch_queue_tasks", "queue", "twin", "state", "running"))
	require.Equal(t, 6.0, value(t, mfs, "disbatch_queue_tasks", "queue", "older", "state", "todo"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "older", "state", "running"), "no count_running yet: no gauge")
	require.Equal(t, 2.0, value(t, mfs, "disbatch_queue_tasks", "queue", "half", "state", "todo"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "half", "state", "running"), "one of the same-named queues has no count_running")
	// count_failed, part of done.
	require.Equal(t, 2.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "failed"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "beta", "state", "failed"), "no counters: no gauge")
	require.Equal(t, 0.0, value(t, mfs, "disbatch_queue_tasks", "queue", "gamma", "state", "failed"))
	require.Equal(t, 4.0, value(t, mfs, "disbatch_queue_tasks", "queue", "twin", "state", "failed"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "older", "state", "failed"), "no count_failed yet: no gauge")
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "half", "state", "failed"), "one of the same-named queues has no count_failed")
	require.Equal(t, 1.0, value(t, mfs, "disbatch_queue_tasks", "queue", "recent", "state", "running"))
	require.Nil(t, find(mfs, "disbatch_queue_tasks", "queue", "recent", "state", "failed"), "no count_failed yet: no gauge")

	require.Equal(t, 2.0, value(t, mfs, "disbatch_node_tasks_running", "queue", "alpha"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_node_tasks_running", "queue", "beta"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_node_tasks_running", "queue", "gamma"))
	require.Equal(t, 2.0, value(t, mfs, "disbatch_node_tasks_running", "queue", "twin"))

	require.Equal(t, 42.0, value(t, mfs, "disbatch_claims_total"))
	require.Equal(t, dto.MetricType_COUNTER, mfs["disbatch_claims_total"].GetType())
	require.Equal(t, 30.0, value(t, mfs, "disbatch_claim_passes_total", "trigger", "wakeup"))
	require.Equal(t, 5.0, value(t, mfs, "disbatch_claim_passes_total", "trigger", "tick"))
	require.Equal(t, 100.0, value(t, mfs, "disbatch_change_stream_events_total"))
	require.Equal(t, 2.0, value(t, mfs, "disbatch_change_stream_resumes_total"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_change_stream_rescans_total"))
	require.Equal(t, 3.0, value(t, mfs, "disbatch_change_stream_quiet_spells_total"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_projector_leader"))
	require.Equal(t, 0.04, value(t, mfs, "disbatch_projection_lag_seconds", "quantile", "0.5"))
	require.Equal(t, 0.075, value(t, mfs, "disbatch_projection_lag_seconds", "quantile", "0.99"))
	require.Equal(t, dto.MetricType_GAUGE, mfs["disbatch_projection_lag_seconds"].GetType())
	require.Equal(t, 77.0, value(t, mfs, "disbatch_projection_events_total"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_projection_drift_queues_total"))
	require.Equal(t, 12.0, value(t, mfs, "disbatch_projection_recounts_total"))
	require.Equal(t, 2.0, value(t, mfs, "disbatch_projection_recount_failures_total"))
	require.Equal(t, dto.MetricType_COUNTER, mfs["disbatch_projection_recount_failures_total"].GetType())
	require.Equal(t, 3.0, value(t, mfs, "disbatch_claim_batches_total"))
	require.Equal(t, 11.0, value(t, mfs, "disbatch_claim_conflicts_total"))
	require.Equal(t, 5.0, value(t, mfs, "disbatch_claim_lingers_total", "end", "slots"))
	require.Equal(t, 2.0, value(t, mfs, "disbatch_claim_lingers_total", "end", "in_vain"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_node_state", "state", "serving"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_node_state", "state", "fenced"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_cluster_leader"))
	require.Equal(t, 4.0, value(t, mfs, "disbatch_task_reasons_total", "queue", "alpha", "reason", "cancelled"))
	require.Equal(t, 2.0, value(t, mfs, "disbatch_task_reasons_total", "queue", "alpha", "reason", "retrying"))
	require.Equal(t, 3.0, value(t, mfs, "disbatch_task_reasons_total", "queue", "twin", "reason", "killed"), "same-named queues added up")
	require.Equal(t, 5.0, value(t, mfs, "disbatch_task_reasons_total", "queue", gone.Hex(), "reason", "timeout"), "a queue gone is named by its id")
	require.Equal(t, dto.MetricType_COUNTER, mfs["disbatch_task_reasons_total"].GetType())

	// Read at scrape time: a change shows at the next gather.
	src.fenced = true
	src.leader = leadership.Status{Leader: true, Epoch: 3}
	mfs = gather(t, m)
	require.Equal(t, 0.0, value(t, mfs, "disbatch_node_state", "state", "serving"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_node_state", "state", "fenced"))
	require.Equal(t, 1.0, value(t, mfs, "disbatch_cluster_leader"))
	src.projector = projections.Stats{}
	src.queues = src.queues[:1]
	src.queues[0].CountTodo = ptr[int64](0)
	src.queues[0].CountRunning = ptr[int64](7)
	src.queues[0].CountFailed = ptr[int64](5)
	mfs = gather(t, m)
	require.Equal(t, 7.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "running"))
	require.Equal(t, 5.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "failed"))
	require.Equal(t, 0.0, value(t, mfs, "disbatch_projector_leader"))
	require.Nil(t, mfs["disbatch_projection_lag_seconds"], "no lag from a node that does not project (its last term's stayed, and max() over the nodes kept the lag alert firing)")
	require.Equal(t, 10.0, value(t, mfs, "disbatch_queue_tasks", "queue", "alpha", "state", "done"))
	require.Nil(t, find(mfs, "disbatch_node_tasks_running", "queue", "beta"))
}

func TestListenAddr(t *testing.T) {
	for in, want := range map[string]string{
		"":               "",
		"9464":           "127.0.0.1:9464",
		":9464":          "127.0.0.1:9464",
		"0":              "127.0.0.1:0",
		"0.0.0.0:9464":   "0.0.0.0:9464",
		"127.0.0.1:9464": "127.0.0.1:9464",
		"localhost:9464": "localhost:9464",
		"[::]:9464":      "[::]:9464",
		"[::1]:9464":     "[::1]:9464",
		"node1:80":       "node1:80",
	} {
		got, err := ListenAddr(in)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{"abc", "65536", ":65536", "host:", "host:http", "-1", "1.2.3.4", "::1"} {
		_, err := ListenAddr(in)
		require.Error(t, err, "%q", in)
	}
}

// get fetches url without keeping the connection.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestServe(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	m := New()
	s, err := Serve("127.0.0.1:0", m, log)
	require.NoError(t, err)
	defer s.Stop()
	base := "http://" + s.Addr()
	require.Equal(t, base+"/metrics", s.URL())
	require.Contains(t, logs.String(), "serving metrics")
	require.Contains(t, logs.String(), s.URL(), "it logs the URL it serves")

	code, body := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before the node has started")
	m.SetReady(true)
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code)
	m.SetReady(false)
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready while stopping")
	code, _ = get(t, base+"/nothing")
	require.Equal(t, http.StatusNotFound, code)

	m.TaskClaimed("demo")
	m.TaskStarted("demo", 4*time.Millisecond)
	m.Attach(&fakeSource{claimer: claimer.Stats{Claims: 1}})
	code, body = get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, "the exposition parses")
	require.Equal(t, 1.0, value(t, mfs, "disbatch_tasks_claimed_total", "queue", "demo"))
	require.Equal(t, uint64(1), find(mfs, "disbatch_task_pickup_seconds", "queue", "demo").GetHistogram().GetSampleCount())
	require.Equal(t, 1.0, value(t, mfs, "disbatch_claims_total"))
	require.Contains(t, mfs, "go_goroutines")

	require.NoError(t, s.Stop())
	require.NoError(t, s.Stop(), "a second Stop does nothing")
	_, err = net.DialTimeout("tcp", s.Addr(), time.Second)
	require.Error(t, err, "nothing listens after Stop")
}

func TestServeBarePortIsLoopback(t *testing.T) {
	for _, addr := range []string{":0", "0"} {
		s, err := Serve(addr, New(), nil)
		require.NoError(t, err)
		host, _, err := net.SplitHostPort(s.Addr())
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host, "%q", addr)
		code, _ := get(t, "http://"+s.Addr()+"/healthz")
		require.Equal(t, http.StatusOK, code)
		require.NoError(t, s.Stop())
	}
}

func TestServeOffAndErrors(t *testing.T) {
	s, err := Serve("", New(), nil)
	require.NoError(t, err)
	require.Nil(t, s, "no address: no server")
	require.NoError(t, s.Stop(), "Stop on the nil server does nothing")

	_, err = Serve("bogus", New(), nil)
	require.ErrorContains(t, err, "bogus")

	busy, err := Serve("127.0.0.1:0", New(), nil)
	require.NoError(t, err)
	defer busy.Stop()
	_, err = Serve(busy.Addr(), New(), nil)
	require.ErrorContains(t, err, "address already in use")
}

func TestStopWaitsForRequestsInFlight(t *testing.T) {
	m := New()
	slow := &blockingCollector{entered: make(chan struct{}, 1), release: make(chan struct{})}
	m.Registry().MustRegister(slow)
	s, err := Serve("127.0.0.1:0", m, nil)
	require.NoError(t, err)
	got := make(chan int, 1)
	go func() {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(s.URL())
		if err != nil {
			got <- -1
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-slow.entered // the scrape is in the collector
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop() }()
	select {
	case <-stopped:
		t.Fatal("Stop returned with a scrape in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(slow.release)
	require.NoError(t, <-stopped)
	require.Equal(t, http.StatusOK, <-got)
}

// blockingCollector is an unchecked collector whose Collect waits for
// release.
type blockingCollector struct{ entered, release chan struct{} }

func (*blockingCollector) Describe(chan<- *prometheus.Desc) {}
func (b *blockingCollector) Collect(chan<- prometheus.Metric) {
	b.entered <- struct{}{}
	<-b.release
}
