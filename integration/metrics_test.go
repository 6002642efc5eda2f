package integration

// disbatchd --metrics-addr: a real node's /metrics, /healthz and /readyz.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// httpGet fetches url (no keep-alive) and returns the status and body.
func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// scrape is one parsed /metrics.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, base string) scrape {
	t.Helper()
	code, body, err := httpGet(base + "/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err, "/metrics parses as the Prometheus text format")
	return mfs
}

// sum adds up the samples of family name (counters, gauges; histograms by
// their count) whose labels include the given name, value pairs; ok is
// false when there are none.
func (s scrape) sum(name string, labels ...string) (total float64, ok bool) {
	mf := s[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		ok = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total, ok
}

// queueCounters reads count_todo and count_total of queue name.
func queueCounters(t *testing.T, db *mongo.Database, name string) (todo, total int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var q struct {
		Todo  int64 `bson:"count_todo"`
		Total int64 `bson:"count_total"`
	}
	require.NoError(t, db.Collection("queues").FindOne(ctx, bson.D{{Key: "name", Value: name}}).Decode(&q))
	return q.Todo, q.Total
}

func TestMetricsOfARealNode(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	cli(t, uri, db.Name(), "", "queue", "create", "demo", "--constructor", demo, "--maxthreads", "3", "--sort", "fifo")
	const total, failing = 12, 4 // every third task fails (status 2)
	submit := func(from, to int) {
		var items []any
		for i := from; i < to; i++ {
			c := "a"
			if i%3 == 2 {
				c = "ac"
			}
			items = append(items, map[string]string{"commands": c})
		}
		cli(t, uri, db.Name(), jsonLines(t, items...), "task", "submit", "demo")
	}

	submit(0, total/2) // found by the first claim
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	n := startNode(t, nodeArgs(uri, db.Name(), "m1", "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)))
	n.waitLog("node started", startWait)
	require.Contains(t, n.log.String(), "url="+base+"/metrics", "the node logs the URL it serves")
	submit(total/2, total) // found through the change stream

	ts := waitTasks(t, db, 30*time.Second, "all tasks finished", func(ts []task) bool { return len(ts) == total && allFinished(ts) })
	byStatus := map[int]int{}
	for _, x := range ts {
		byStatus[x.Status]++
	}
	require.Equal(t, map[int]int{1: total - failing, 2: failing}, byStatus)

	for _, path := range []string{"/healthz", "/readyz"} {
		code, body, err := httpGet(base + path)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}

	// The counters follow the tasks; the queue gauges follow the projected
	// counters, which the node re-reads every tick: poll until they agree.
	var s scrape
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for {
		s = scrapeMetrics(t, base)
		todo, all := queueCounters(t, db, "demo")
		gTodo, okTodo := s.sum("disbatch_queue_tasks", "queue", "demo", "state", "todo")
		gDone, okDone := s.sum("disbatch_queue_tasks", "queue", "demo", "state", "done")
		finished, _ := s.sum("disbatch_tasks_finished_total", "queue", "demo")
		running, _ := s.sum("disbatch_node_tasks_running", "queue", "demo")
		last = fmt.Sprintf("db todo=%d total=%d; gauges todo=%v(%v) done=%v(%v); finished=%v running=%v",
			todo, all, gTodo, okTodo, gDone, okDone, finished, running)
		if okTodo && okDone && todo == 0 && all == total && gTodo == float64(todo) && gDone == float64(all-todo) &&
			finished == total && running == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics did not catch up with the database: %s", last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Log(last)

	value := func(name string, labels ...string) float64 {
		t.Helper()
		v, ok := s.sum(name, labels...)
		require.True(t, ok, "%s%v is not in /metrics", name, labels)
		return v
	}
	require.Equal(t, float64(total), value("disbatch_tasks_claimed_total", "queue", "demo"))
	require.Equal(t, float64(total-failing), value("disbatch_tasks_finished_total", "queue", "demo", "status", "1"))
	require.Equal(t, float64(failing), value("disbatch_tasks_finished_total", "queue", "demo", "status", "2"))
	require.Equal(t, dto.MetricType_HISTOGRAM, s["disbatch_task_pickup_seconds"].GetType())
	require.Equal(t, float64(total), value("disbatch_task_pickup_seconds", "queue", "demo"), "pickup observations")
	require.Equal(t, float64(total), value("disbatch_task_run_seconds", "queue", "demo"), "run observations")
	require.Equal(t, float64(total), value("disbatch_claims_total"))
	passes := value("disbatch_claim_passes_total", "trigger", "wakeup") + value("disbatch_claim_passes_total", "trigger", "tick")
	require.Positive(t, passes)
	require.Positive(t, value("disbatch_change_stream_events_total"))
	value("disbatch_change_stream_resumes_total")
	value("disbatch_change_stream_rescans_total")
	require.Equal(t, 1.0, value("disbatch_projector_leader"), "the only node is the projector")
	require.Equal(t, 1.0, value("disbatch_cluster_leader"), "the only node leads the cluster-wide duties")
	require.Positive(t, value("disbatch_projection_events_total"))
	require.Zero(t, value("disbatch_projection_drift_queues_total"))
	require.Positive(t, value("disbatch_projection_recounts_total"), "the term's catch-up recount, at least")
	require.Zero(t, value("disbatch_projection_recount_failures_total"))
	value("disbatch_projection_lag_seconds", "quantile", "0.5")
	value("disbatch_projection_lag_seconds", "quantile", "0.99")
	require.Positive(t, value("go_goroutines"))
	require.Positive(t, value("process_resident_memory_bytes"))

	// Cancels made with the CLI (no node carries them out) are counted by
	// the projector from its stream, with the reasons nodes write.
	cli(t, uri, db.Name(), "", "queue", "create", "held", "--constructor", demo, "--maxthreads", "0")
	cli(t, uri, db.Name(), jsonLines(t, map[string]string{"commands": "a"}, map[string]string{"commands": "a"}), "task", "submit", "held")
	cli(t, uri, db.Name(), "", "task", "cancel", "--queue", "held", "--by", "metrics-test")
	deadline = time.Now().Add(20 * time.Second)
	for {
		s = scrapeMetrics(t, base)
		if v, _ := s.sum("disbatch_task_reasons_total", "queue", "held", "reason", "cancelled"); v == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("disbatch_task_reasons_total{queue=held,reason=cancelled} is not 2: %v", s["disbatch_task_reasons_total"])
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The alerts on disbatchd (deployments/prometheus/alerts.yml) select
	// series it serves (the reasons' among them, now that some are counted).
	requireAlertSeries(t, s, isNodeMetric, 10)

	n.signal(syscall.SIGTERM)
	require.Zero(t, n.wait(15*time.Second))
	_, _, err := httpGet(base + "/healthz")
	require.Error(t, err, "the metrics server stops with the node")
}

// TestMetricsBeforeMongoDBAnswers: /healthz answers while the node waits for
// MongoDB, /readyz says 503; a bare port from DISBATCH_METRICS_ADDR binds
// the loopback interface.
func TestMetricsBeforeMongoDBAnswers(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	n := startNode(t, []string{"--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200", "--node", "waiting"},
		"DISBATCH_METRICS_ADDR="+strconv.Itoa(port))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	n.waitLog("url="+base+"/metrics", startWait)
	n.waitLog("cannot connect to MongoDB; retrying", startWait)

	code, _, err := httpGet(base + "/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, body, err := httpGet(base + "/readyz")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	s := scrapeMetrics(t, base)
	require.Contains(t, s, "go_goroutines")
	require.NotContains(t, s, "disbatch_claims_total", "no node yet")

	// Only the loopback address listens on the port.
	if ip := nonLoopbackIP(); ip != "" {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("a bare port also listens on %s", ip)
		}
	}

	n.signal(syscall.SIGTERM)
	require.Zero(t, n.wait(15*time.Second))
}

func TestMetricsAddrUsageError(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"nonsense", "host:http", "99999"} {
		r := runBin(t, disbatchdBin, "", nil, "--mongo-uri", "mongodb://127.0.0.1:1/", "--node", "x", "--metrics-addr", addr)
		require.Equal(t, 2, r.code, "%s: %s", addr, r.stderr)
		require.Contains(t, r.stderr, "metrics address")
	}
}

// nonLoopbackIP is an IPv4 address of this machine other than loopback,
// or "".
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}
