package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
)

// SuperviseReport is the supervise group: what running a task under a
// supervisor process (issue 19: tasks that outlive the node's restarts)
// costs against running it inside the node.
type SuperviseReport struct {
	Floor       Latency `json:"floor"`
	FloorSource string  `json:"floor_source"`
	// InProcess and Supervised: insert start -> the shell task's process
	// running (it writes bash's $EPOCHREALTIME first), one at a time.
	InProcess  Latency `json:"in_process"`
	Supervised Latency `json:"supervised"`
	// InProcessPickup and SupervisedPickup: insert start -> the task's
	// status 0 seen by a change stream, the pickup group's measure.
	InProcessPickup  Latency `json:"in_process_pickup"`
	SupervisedPickup Latency `json:"supervised_pickup"`
	PickupRatio      Ratio   `json:"pickup_ratio"` // supervised pickup / the floor
	Ratio            Ratio   `json:"ratio"`        // supervised / in-process
	FloorRatio       Ratio   `json:"floor_ratio"`  // supervised / the pickup floor
	// Sleeping supervised tasks measured at once, and each supervisor's
	// memory: VmRSS (shared pages of the binary counted in each) and PSS
	// (shared pages divided among their users), KiB.
	Sleeping  int     `json:"sleeping"`
	RSSKiB    Summary `json:"rss_kib"`
	PSSKiB    Summary `json:"pss_kib"`
	StartSecs float64 `json:"start_seconds"` // until every sleeping task ran under its supervisor
	// Idle supervisors of the node's pool (supervisor.DefaultPool) beside
	// them, and their VmRSS, KiB.
	Idle       int      `json:"idle"`
	IdleRSSKiB Summary  `json:"idle_rss_kib"`
	Goals      []Goal   `json:"goals"`
	Failures   []string `json:"failures,omitempty"`
}

// Summary is a mean and a max.
type Summary struct {
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

const (
	superviseGoalRatio = 1.3
	superviseGoalRSS   = 5 * 1024 // KiB
	superviseGap       = 25 * time.Millisecond
	superviseThreads   = 16
)

// superviseFinishCommand is the hidden subcommand that writes a finish
// for a supervisor whose node is away (as disbatchd's).
const superviseFinishCommand = "supervise-finish"

// superviseBinary is the small supervisor binary: $DISBATCH_SUPERVISOR
// (make bench builds it), else disbatch-supervisor beside this program.
func superviseBinary() (string, error) {
	if p := os.Getenv("DISBATCH_SUPERVISOR"); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "disbatch-supervisor")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no supervisor binary: run through make bench, or go build -o bin/ ./cmd/disbatch-supervisor and set DISBATCH_SUPERVISOR=bin/disbatch-supervisor")
	}
	return p, nil
}

func (e *env) supervise(ctx context.Context, pickup *PickupReport) (*SuperviseReport, error) {
	rep := &SuperviseReport{}
	var err error
	if rep.Floor, rep.FloorSource, err = e.controlFloor(ctx, pickup); err != nil {
		return rep, fmt.Errorf("supervise, pickup floor: %w", err)
	}
	e.log.Info("supervise: start latency, in-process and supervised in turn", "tasks", e.cfg.SuperviseSamples)
	if rep.InProcess, rep.Supervised, err = e.superviseStarts(ctx, rep); err != nil {
		return rep, fmt.Errorf("supervise, start latency: %w", err)
	}
	e.log.Info("supervise: memory of sleeping supervised tasks", "tasks", e.cfg.SuperviseSleeping)
	if err := e.superviseMemory(ctx, rep); err != nil {
		return rep, fmt.Errorf("supervise, memory: %w", err)
	}
	rep.Ratio = Ratio{What: "supervised / in-process: insert -> shell process running", P50: ratio(rep.Supervised.P50, rep.InProcess.P50), P99: ratio(rep.Supervised.P99, rep.InProcess.P99)}
	rep.FloorRatio = Ratio{What: "supervised start / pickup floor", P50: ratio(rep.Supervised.P50, rep.Floor.P50), P99: ratio(rep.Supervised.P99, rep.Floor.P99)}
	rep.PickupRatio = Ratio{What: "supervised pickup (insert -> running seen) / pickup floor", P50: ratio(rep.SupervisedPickup.P50, rep.Floor.P50), P99: ratio(rep.SupervisedPickup.P99, rep.Floor.P99)}
	rep.Goals = []Goal{
		{Goal: fmt.Sprintf("supervised start p50 <= %gx in-process (%s <= %s ms)", superviseGoalRatio, fms(rep.Supervised.P50), fms(superviseGoalRatio*rep.InProcess.P50)),
			Met: rep.Supervised.N > 0 && rep.InProcess.N > 0 && rep.Supervised.P50 <= superviseGoalRatio*rep.InProcess.P50},
		{Goal: fmt.Sprintf("RSS per supervisor <= 5 MiB (mean %.1f MiB)", rep.RSSKiB.Mean/1024), Met: rep.RSSKiB.Mean > 0 && rep.RSSKiB.Mean <= superviseGoalRSS},
		{Goal: fmt.Sprintf("supervised pickup p50 <= %gx the floor (%s <= %s ms)", superviseGoalRatio, fms(rep.SupervisedPickup.P50), fms(superviseGoalRatio*rep.Floor.P50)),
			Met: rep.SupervisedPickup.N > 0 && rep.Floor.N > 0 && rep.SupervisedPickup.P50 <= superviseGoalRatio*rep.Floor.P50},
	}
	return rep, nil
}

// superviseNode starts one node serving a shell queue of db, with or
// without supervisors; stop stops it and removes its state directory.
func (e *env) superviseNode(ctx context.Context, db string, threads int, supervised bool) (stateDir string, stop func(), err error) {
	reg := plugin.NewRegistry()
	reg.Register(plugin.ShellConstructor, plugin.Shell())
	spec := nodeSpec{DB: db, Count: 1, Name: "bench-sup", MaxThreads: threads, Plugins: reg}
	if supervised {
		exe, err := os.Executable()
		if err != nil {
			return "", nil, err
		}
		sup, err := superviseBinary()
		if err != nil {
			return "", nil, err
		}
		if stateDir, err = os.MkdirTemp("", "dsb-"); err != nil {
			return "", nil, err
		}
		spec.Supervise = &supervisor.Launcher{Dir: stateDir, Command: []string{sup}, FinishCommand: []string{exe, superviseFinishCommand}, Pool: supervisor.DefaultPool}
	}
	ns, err := e.startNodes(ctx, spec)
	if err != nil {
		return "", nil, err
	}
	return stateDir, func() {
		if stateDir != "" {
			for _, pid := range supervisor.PIDs(stateDir) {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
		ns.stop()
		if stateDir != "" {
			_ = os.RemoveAll(stateDir)
		}
	}, nil
}

// superviseStarts times SuperviseSamples shell task starts each way, from
// each insert to its process running, interleaved: a node with
// supervisors and one without, each on a database of its own, get a task
// in turn, superviseGap/2 apart, so both see the same moments of MongoDB
// (a checkpoint, a cache flush) and the same load.
func (e *env) superviseStarts(ctx context.Context, rep *SuperviseReport) (inProcess, supervised Latency, err error) {
	dir, err := os.MkdirTemp("", "dsb-starts-")
	if err != nil {
		return Latency{}, Latency{}, err
	}
	defer os.RemoveAll(dir)
	params, err := bson.Marshal(bson.D{{Key: "command", Value: fmt.Sprintf(`echo $EPOCHREALTIME > '%s'/"$DISBATCH_TASK_ID"`, dir)}})
	if err != nil {
		return Latency{}, Latency{}, err
	}
	type side struct {
		db       *mongo.Database
		s        *store.Store
		q        bson.ObjectID
		ids      []bson.ObjectID
		inserted map[bson.ObjectID]time.Time
		running  *statusWatch // the status 0 writes, as a change stream sees them
	}
	var sides [2]*side // in-process, supervised
	for i, sup := range []bool{false, true} {
		db, drop := e.database(fmt.Sprintf("supervise-%d", i))
		defer drop()
		s := store.New(db, store.Options{})
		if err := s.IndexesEnsure(ctx); err != nil {
			return Latency{}, Latency{}, err
		}
		threads := superviseThreads
		q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "sh", Constructor: plugin.ShellConstructor, MaxThreads: &threads, Sort: schema.SortFIFO})
		if err != nil {
			return Latency{}, Latency{}, err
		}
		w, err := e.watchStatus(ctx, db.Name(), int32(schema.StatusRunning))
		if err != nil {
			return Latency{}, Latency{}, err
		}
		defer w.close()
		_, stop, err := e.superviseNode(ctx, db.Name(), threads, sup)
		if err != nil {
			return Latency{}, Latency{}, err
		}
		defer stop()
		sides[i] = &side{db: db, s: s, q: q.ID, inserted: map[bson.ObjectID]time.Time{}, running: w}
	}
	time.Sleep(time.Second) // the supervised node's pool is warm
	for range e.cfg.SuperviseSamples {
		for _, sd := range sides {
			t0 := time.Now()
			got, err := sd.s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: sd.q, Parameters: []bson.Raw{params}})
			if err != nil {
				return Latency{}, Latency{}, err
			}
			sd.inserted[got[0]] = t0
			sd.ids = append(sd.ids, got[0])
			time.Sleep(superviseGap / 2)
		}
	}
	var out [2]Latency
	for i, sd := range sides {
		if left, err := e.waitFinished(ctx, sd.db, sd.ids, time.Minute); err != nil {
			return Latency{}, Latency{}, err
		} else if left > 0 {
			return Latency{}, Latency{}, fmt.Errorf("%d of %d tasks did not finish within a minute", left, len(sd.ids))
		}
		var lat, pickup []time.Duration
		expired := time.After(10 * time.Second) // the changes of finished tasks
		for _, id := range sd.ids {
			if at, ok := sd.running.arrived(ctx, id, expired); ok {
				pickup = append(pickup, at.Sub(sd.inserted[id]))
			}
			b, err := os.ReadFile(filepath.Join(dir, id.Hex()))
			if err != nil {
				rep.Failures = append(rep.Failures, fmt.Sprintf("task %s wrote no start time: %v", id.Hex(), err))
				continue
			}
			secs, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			if err != nil {
				return Latency{}, Latency{}, fmt.Errorf("bash's $EPOCHREALTIME %q: %w", b, err)
			}
			lat = append(lat, time.Unix(0, int64(secs*1e9)).Sub(sd.inserted[id]))
		}
		out[i] = summarize(lat)
		if i == 1 {
			rep.SupervisedPickup = summarize(pickup)
		} else {
			rep.InProcessPickup = summarize(pickup)
		}
	}
	return out[0], out[1], nil
}

// superviseMemory runs SuperviseSleeping supervised `exec sleep 600`
// tasks at once and reads each supervisor's memory.
func (e *env) superviseMemory(ctx context.Context, rep *SuperviseReport) error {
	db, drop := e.database("supervise-mem")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return err
	}
	n := e.cfg.SuperviseSleeping
	q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "sleep", Constructor: plugin.ShellConstructor, MaxThreads: &n, Sort: schema.SortFIFO})
	if err != nil {
		return err
	}
	params, err := bson.Marshal(bson.D{{Key: "command", Value: "exec sleep 600"}})
	if err != nil {
		return err
	}
	dir, stop, err := e.superviseNode(ctx, db.Name(), n, true)
	if err != nil {
		return err
	}
	defer stop()
	begin := time.Now()
	ps := make([]bson.Raw, n)
	for i := range ps {
		ps[i] = params
	}
	if _, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: ps}); err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		running, err := countStatus(ctx, db, q.ID, schema.StatusRunning)
		if err != nil {
			return err
		}
		busy, _ := supervisor.Processes(dir)
		if int(running) == n && len(busy) == n {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d tasks running, %d supervisors running tasks (in %s), after 3 minutes", running, n, len(busy), dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep.StartSecs = time.Since(begin).Seconds()
	time.Sleep(time.Second) // settled: every supervisor waiting on its sleep
	rep.Sleeping = n
	busy, idle := supervisor.Processes(dir)
	var rss, pss, idleRSS []float64
	for _, pid := range busy {
		r, p, err := procMemory(pid)
		if err != nil {
			continue
		}
		rss, pss = append(rss, r), append(pss, p)
	}
	for _, pid := range idle {
		if r, _, err := procMemory(pid); err == nil {
			idleRSS = append(idleRSS, r)
		}
	}
	rep.RSSKiB, rep.PSSKiB = summary(rss), summary(pss)
	rep.Idle, rep.IdleRSSKiB = len(idle), summary(idleRSS)
	return nil
}

func summary(v []float64) Summary {
	var s Summary
	for _, x := range v {
		s.Mean += x
		s.Max = max(s.Max, x)
	}
	if len(v) > 0 {
		s.Mean /= float64(len(v))
	}
	return s
}

// procMemory reads a process's VmRSS and Pss, KiB.
func procMemory(pid int) (rss, pss float64, err error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sm, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	return kibField(st, "VmRSS:"), kibField(sm, "Pss:"), nil
}

func kibField(b []byte, name string) float64 {
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(name)); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(string(v)), "kB")), 64)
			return f
		}
	}
	return 0
}

// renderSupervise renders the supervise group's tables.
func renderSupervise(b *strings.Builder, r *Report) {
	v := r.Supervise
	if v == nil {
		return
	}
	t := table{title: fmt.Sprintf("SUPERVISED TASKS, ms: insert start -> the shell task's process running (bash $EPOCHREALTIME), each way in turn, one task every %s each, %s apart", superviseGap, superviseGap/2),
		header: []string{"what", "n", "p50", "p95", "p99", "max"}}
	for _, x := range []struct {
		what string
		l    Latency
	}{{"in-process (--supervise=false)", v.InProcess}, {"supervised (a disbatch-supervisor process per task)", v.Supervised},
		{"pickup, in-process: insert -> running, seen by a change stream", v.InProcessPickup}, {"pickup, supervised: the same", v.SupervisedPickup}, {"pickup floor of this run: insert -> running, bare driver loop (" + v.FloorSource + ")", v.Floor}} {
		t.add(x.what, strconv.Itoa(x.l.N), fms(x.l.P50), fms(x.l.P95), fms(x.l.P99), fms(x.l.Max))
	}
	t.render(b)
	fmt.Fprintf(b, "  %d supervised `exec sleep 600` tasks at once on one node (all running under their supervisors after %.1f s): per supervisor VmRSS mean %.0f KiB (max %.0f), PSS mean %.0f KiB (max %.0f); beside them %d idle supervisors of the pool, VmRSS mean %.0f KiB\n\n",
		v.Sleeping, v.StartSecs, v.RSSKiB.Mean, v.RSSKiB.Max, v.PSSKiB.Mean, v.PSSKiB.Max, v.Idle, v.IdleRSSKiB.Mean)
	if len(v.Goals) == 3 {
		t = table{title: "SUPERVISED TASKS: RATIOS AND GOALS", header: []string{"ratio", "p50", "p99", "goal"}}
		t.add(v.Ratio.What, fx(v.Ratio.P50), fx(v.Ratio.P99), v.Goals[0].String())
		t.add(v.FloorRatio.What, fx(v.FloorRatio.P50), fx(v.FloorRatio.P99), "")
		t.add("memory", "", "", v.Goals[1].String())
		t.add(v.PickupRatio.What, fx(v.PickupRatio.P50), fx(v.PickupRatio.P99), v.Goals[2].String())
		t.render(b)
	}
	if len(v.Failures) > 0 {
		b.WriteString("  SUPERVISED TASKS FAILURES:\n")
		for _, f := range v.Failures {
			b.WriteString("  - " + f + "\n")
		}
		b.WriteString("\n")
	}
}

// supervise checks the supervise group's figures.
func (k *checker) supervise(v *SuperviseReport, cfg config) {
	if v == nil {
		k.bad("supervise: missing")
		return
	}
	for _, f := range v.Failures {
		k.bad("supervise: %s", f)
	}
	k.latency("supervise, pickup floor", v.Floor)
	k.latency("supervise, in-process starts", v.InProcess)
	k.latency("supervise, supervised starts", v.Supervised)
	if v.InProcess.N != cfg.SuperviseSamples || v.Supervised.N != cfg.SuperviseSamples {
		k.bad("supervise: %d and %d starts timed, want %d each", v.InProcess.N, v.Supervised.N, cfg.SuperviseSamples)
	}
	if v.Sleeping != cfg.SuperviseSleeping {
		k.bad("supervise: %d sleeping tasks measured, want %d", v.Sleeping, cfg.SuperviseSleeping)
	}
	k.positive("supervise: RSS per supervisor", v.RSSKiB.Mean)
	k.positive("supervise: PSS per supervisor", v.PSSKiB.Mean)
	k.latency("supervise, supervised pickups", v.SupervisedPickup)
	if v.SupervisedPickup.N != cfg.SuperviseSamples {
		k.bad("supervise: %d supervised pickups seen, want %d", v.SupervisedPickup.N, cfg.SuperviseSamples)
	}
	if len(v.Goals) != 3 {
		k.bad("supervise: %d goals, want 3", len(v.Goals))
	}
}
