package metrics

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/schema"
)

// Source is what the collector reads at scrape time; *node.Node is one.
type Source interface {
	// Queues returns the queues as last read, with their counters.
	Queues() []schema.Queue
	// Running returns how many tasks of queue q the node holds.
	Running(q bson.ObjectID) int
	ClaimerStats() claimer.Stats
	StreamStats() events.Stats
	ProjectorStats() projections.Stats
	// Fenced and Draining: see node.Node.
	Fenced() bool
	Draining() bool
	// LeaderStatus: whether the node leads the cluster-wide duties.
	LeaderStatus() leadership.Status
}

var _ Source = (*node.Node)(nil)

// PickupBuckets are the buckets of disbatch_task_pickup_seconds: 1 ms to
// 60 s, dense below 100 ms (a change-stream pickup takes a few ms, a
// poll-only one up to the tick).
var PickupBuckets = []float64{
	0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// RunBuckets are the buckets of disbatch_task_run_seconds: 1 ms to 1 h.
var RunBuckets = []float64{
	0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
}

// Metrics is one node's registry. It is a node.Observer; Attach gives it
// the node to read at scrape time, SetReady drives /readyz.
type Metrics struct {
	reg      *prometheus.Registry
	claimed  *prometheus.CounterVec
	pickup   *prometheus.HistogramVec
	finished *prometheus.CounterVec
	control  *prometheus.CounterVec
	run      *prometheus.HistogramVec

	src   atomic.Pointer[Source]
	ready atomic.Bool
}

var _ node.Observer = (*Metrics)(nil)

// New returns a registry with the task metrics, the node collector (empty
// until Attach) and the Go and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		claimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "disbatch_tasks_claimed_total", Help: "Tasks claimed by this node.",
		}, []string{"queue"}),
		pickup: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "disbatch_task_pickup_seconds", Help: "From when a task could run (its ctime, or later its not_before, the end of its last attempt or an operator's requeue) to its running (status 0) on this node.",
			Buckets: PickupBuckets,
		}, []string{"queue"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "disbatch_tasks_finished_total", Help: "Tasks this node finished, by final status (1 succeeded, 2 failed, other plugin statuses); an attempt sent back for a retry is not a finish (disbatch_task_control_total{action=\"retry\"} counts those).",
		}, []string{"queue", "status"}),
		control: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "disbatch_task_control_total",
			Help: "Task control this node carried out, by queue and action: killed (an operator's kill), timeout, fenced (killed by its node's fence), expired (claimed after " +
				"its expires_at), retry (a failed attempt sent back), detached (the node stopped and left the task running under its supervisor), " +
				"adopted (a start took a running task back from its supervisor); as the leader: released (delayed tasks queued at their not_before), " +
				"expired_waiting (waiting tasks finished unrun at their expires_at). Sum over the nodes for the cluster.",
		}, []string{"queue", "action"}),
		run: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "disbatch_task_run_seconds", Help: "How long tasks ran on this node (running to finished).",
			Buckets: RunBuckets,
		}, []string{"queue"}),
	}
	m.reg.MustRegister(m.claimed, m.pickup, m.finished, m.control, m.run, &nodeCollector{m: m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry returns the registry, e.g. to register more collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Attach makes the collector read src (the node) at scrape time.
func (m *Metrics) Attach(src Source) { m.src.Store(&src) }

// SetReady sets what /readyz answers: 200 when ready, 503 otherwise.
func (m *Metrics) SetReady(ready bool) { m.ready.Store(ready) }

// Ready reports what SetReady last set.
func (m *Metrics) Ready() bool { return m.ready.Load() }

// TaskClaimed implements node.Observer.
func (m *Metrics) TaskClaimed(queue string) { m.claimed.WithLabelValues(queue).Inc() }

// TaskStarted implements node.Observer. A negative pickup (the submitter's
// clock ahead of ours) counts as 0.
func (m *Metrics) TaskStarted(queue string, pickup time.Duration) {
	m.pickup.WithLabelValues(queue).Observe(max(pickup, 0).Seconds())
}

// TaskFinished implements node.Observer.
func (m *Metrics) TaskFinished(queue string, status schema.Status, run time.Duration, retried bool) {
	if !retried {
		m.finished.WithLabelValues(queue, strconv.Itoa(int(status))).Inc()
	}
	m.run.WithLabelValues(queue).Observe(max(run, 0).Seconds())
}

// TaskControlled implements node.Observer.
func (m *Metrics) TaskControlled(queue, action string, n int) {
	m.control.WithLabelValues(queue, action).Add(float64(n))
}

// nodeCollector reads the attached Source at scrape time.
type nodeCollector struct{ m *Metrics }

var (
	descQueueTasks = prometheus.NewDesc("disbatch_queue_tasks",
		"Tasks in each queue by state, from the queue's projected counters (todo: status <= 0; done = count_total - count_todo; running: count_running, "+
			"the tasks in -1 or 0 on any node, which todo includes; failed: count_failed, the tasks in 2, which done includes). "+
			"Absent while a queue has no counters (running: no count_running; failed: no count_failed).",
		[]string{"queue", "state"}, nil)
	descRunning = prometheus.NewDesc("disbatch_node_tasks_running",
		"Tasks of each queue this node holds (claimed or running).", []string{"queue"}, nil)
	descClaims = prometheus.NewDesc("disbatch_claims_total",
		"Tasks claimed by this node's claimer.", nil, nil)
	descPasses = prometheus.NewDesc("disbatch_claim_passes_total",
		"Claim passes that found work, by what started them (a change-stream wake-up or the tick).", []string{"trigger"}, nil)
	descStreamEvents = prometheus.NewDesc("disbatch_change_stream_events_total",
		"Change-stream events this node received.", nil, nil)
	descStreamResumes = prometheus.NewDesc("disbatch_change_stream_resumes_total",
		"Times the change stream was reopened after an error.", nil, nil)
	descStreamRescans = prometheus.NewDesc("disbatch_change_stream_rescans_total",
		"Rescans after lost change-stream history.", nil, nil)
	descStreamQuiets = prometheus.NewDesc("disbatch_change_stream_quiet_spells_total",
		"Times this node let its wake-up stream go while every queue it serves had a backlog (it claims as its slots free up); "+
			"each ends with the stream reopened at the present and the queues tried again.", nil, nil)
	descLeader = prometheus.NewDesc("disbatch_projector_leader",
		"1 while this node holds the counter projector's lease, else 0.", nil, nil)
	descLag = prometheus.NewDesc("disbatch_projection_lag_seconds",
		"Projection lag (event to counters committed) over the latest 8,192 events this node applied in the last 5 minutes (0 when none); only while this node holds the projector's lease.", []string{"quantile"}, nil)
	descProjEvents = prometheus.NewDesc("disbatch_projection_events_total",
		"Task events this node applied to the counters as projector (events a new term reads again, which the counters already hold, are not counted).", nil, nil)
	descNodeState = prometheus.NewDesc("disbatch_node_state",
		"1 for the state the node is in: serving, fenced (no heartbeat acknowledged for --fence-after: not claiming, tasks killed) or draining (asked to exit when idle).", []string{"state"}, nil)
	descConflicts = prometheus.NewDesc("disbatch_claim_conflicts_total",
		"Tasks a batched claim of this node read that another node took first (claim conflicts between nodes).", nil, nil)
	descBatches = prometheus.NewDesc("disbatch_claim_batches_total",
		"Batched claims (update-then-find, on a backlog) that won tasks.", nil, nil)
	descLingers = prometheus.NewDesc("disbatch_claim_lingers_total",
		"Batched claims that waited for free slots (--claim-linger), and those whose wait ran out in vain (then claims rest from waiting).", []string{"end"}, nil)
	descClusterLeader = prometheus.NewDesc("disbatch_cluster_leader",
		"1 while this node holds the \"leader\" lease and runs the cluster-wide duties (stale-claim sweep, dead-node recovery), else 0.", nil, nil)
	descDrift = prometheus.NewDesc("disbatch_projection_drift_queues_total",
		"Queues whose counters differed from a recount (should stay 0).", nil, nil)
	descRecounts = prometheus.NewDesc("disbatch_projection_recounts_total",
		"Recounts of the queues' counters this node's counter projector completed (a term's catch-up, new or moved queues, every 10 minutes, after a change it could not place).", nil, nil)
	descRecountFailures = prometheus.NewDesc("disbatch_projection_recount_failures_total",
		"Recounts (or their repairs) that failed; each is retried after a backoff of 1 s, doubling to a minute (the log's retry_in). "+
			"While they fail, counters that drifted stay unrepaired and the checkpoint waits.", nil, nil)
	descPreImages = prometheus.NewDesc("disbatch_projection_pre_images",
		"1 while this node's counter projector keeps the tasks collection's change-stream pre-images on (a term's start, and PreImagesIdle after another program's change), 0 otherwise.", nil, nil)
	descReasons = prometheus.NewDesc("disbatch_task_reasons_total",
		"Reasons written on tasks (why a task ended or is held: cancelled, killed, timeout, expired, retrying, requeued, rerun, orphaned, ...), "+
			"by queue, whoever wrote them (a node, the CLI, the web API, another program): counted from the change stream by the counter "+
			"projector while this node held its lease. Sum over the nodes for the cluster.", []string{"queue", "reason"}, nil)
)

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueueTasks, descRunning, descClaims, descPasses, descStreamEvents,
		descStreamResumes, descStreamRescans, descStreamQuiets, descLeader, descLag, descProjEvents, descDrift, descRecounts, descRecountFailures, descPreImages, descNodeState, descBatches, descConflicts, descClusterLeader, descReasons, descLingers} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.m.src.Load()
	if p == nil {
		return
	}
	src := *p
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}

	// Queue names are not unique in the database; same-named queues are
	// added up so that no series is collected twice.
	type queueSums struct {
		todo, total     int64
		running         int
		counted, broken bool
		// cluster is count_running (all nodes), apart from running (this
		// node's): a queue may have todo and total but not it yet.
		cluster                       int64
		clusterCounted, clusterBroken bool
		// failed is count_failed, which a queue may lack in the same way.
		failed                      int64
		failedCounted, failedBroken bool
	}
	sums := map[string]*queueSums{}
	var names []string
	queues := src.Queues()
	nameOf := make(map[bson.ObjectID]string, len(queues))
	for _, q := range queues {
		nameOf[q.ID] = q.Name
		s := sums[q.Name]
		if s == nil {
			s = &queueSums{}
			sums[q.Name] = s
			names = append(names, q.Name)
		}
		s.running += src.Running(q.ID)
		if q.CountRunning == nil {
			s.clusterBroken = true
		} else {
			s.cluster += *q.CountRunning
			s.clusterCounted = true
		}
		if q.CountFailed == nil {
			s.failedBroken = true
		} else {
			s.failed += *q.CountFailed
			s.failedCounted = true
		}
		if q.CountTodo == nil || q.CountTotal == nil {
			s.broken = true // one same-named queue without counters: no sum
			continue
		}
		s.todo += *q.CountTodo
		s.total += *q.CountTotal
		s.counted = true
	}
	for _, name := range names {
		s := sums[name]
		gauge(descRunning, float64(s.running), name)
		if s.counted && !s.broken {
			gauge(descQueueTasks, float64(s.todo), name, "todo")
			gauge(descQueueTasks, float64(s.total-s.todo), name, "done")
		}
		if s.clusterCounted && !s.clusterBroken {
			gauge(descQueueTasks, float64(s.cluster), name, "running")
		}
		if s.failedCounted && !s.failedBroken {
			gauge(descQueueTasks, float64(s.failed), name, "failed")
		}
	}

	cs := src.ClaimerStats()
	counter(descClaims, cs.Claims)
	counter(descPasses, cs.WakePasses, "wakeup")
	counter(descPasses, cs.TickPasses, "tick")
	counter(descBatches, cs.Batches)
	counter(descConflicts, cs.Contended)
	counter(descLingers, cs.Lingers-cs.LingersTimedOut, "slots")
	counter(descLingers, cs.LingersTimedOut, "in_vain")

	fenced, draining := src.Fenced(), src.Draining()
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	gauge(descNodeState, flag(!fenced && !draining), "serving")
	gauge(descNodeState, flag(fenced), "fenced")
	gauge(descNodeState, flag(draining), "draining")
	gauge(descClusterLeader, flag(src.LeaderStatus().Leader))

	ss := src.StreamStats()
	counter(descStreamEvents, ss.Events)
	counter(descStreamResumes, ss.Resumes)
	counter(descStreamRescans, ss.Rescans)
	counter(descStreamQuiets, ss.Quiets)

	ps := src.ProjectorStats()
	leader := 0.0
	if ps.Leader {
		leader = 1
	}
	gauge(descLeader, leader)
	if ps.Leader { // another node's lags are the projector's now
		gauge(descLag, ps.LagP50.Seconds(), "0.5")
		gauge(descLag, ps.LagP99.Seconds(), "0.99")
	}
	counter(descProjEvents, ps.Events)
	counter(descDrift, ps.DriftQueues)
	counter(descRecounts, ps.Reconciles)
	counter(descRecountFailures, ps.RecountFailures)
	gauge(descPreImages, flag(ps.PreImages))
	// By queue name (same-named queues added up; a queue gone since is
	// named by its id).
	reasons := map[[2]string]int64{}
	for k, n := range ps.Reasons {
		name, ok := nameOf[k.Queue]
		if !ok {
			name = k.Queue.Hex()
		}
		reasons[[2]string{name, k.Reason}] += n
	}
	for k, n := range reasons {
		counter(descReasons, n, k[0], k[1])
	}
}
