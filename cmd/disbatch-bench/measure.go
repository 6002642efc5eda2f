package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/disbatch-go/disbatch/supervisor"
	"github.com/disbatch-go/disbatch/web/live"
)

// measure runs the selected groups and returns what it measured, also when
// a group failed (then with the error).
func measure(ctx context.Context, cfg config, log *slog.Logger) (*Report, error) {
	begin := time.Now()
	log.Info("disbatch-bench starting", "mode", map[bool]string{false: "default", true: "quick"}[cfg.Quick], "groups", cfg.Only)
	e, err := setup(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep := &Report{Conditions: e.conditions(ctx)}
	c := &rep.Conditions
	c.Counts = counts(cfg)
	defer func() { c.Seconds = time.Since(begin).Seconds() }()

	load := func(phase string) {
		if l, ok := loadAverage(); ok {
			c.Load = append(c.Load, PhaseLoad{Phase: phase, Load1: l})
		}
	}
	load("start")
	phase := func(name string, fn func() error) error {
		start := time.Now()
		err := fn()
		load(name)
		log.Info("phase done", "phase", name, "took", time.Since(start).Round(time.Millisecond), "total", time.Since(begin).Round(time.Second))
		return err
	}
	if cfg.runs(groupPickup) {
		if err := phase(groupPickup, func() (err error) { rep.Pickup, err = e.pickup(ctx); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.River {
		if err := phase("river", func() (err error) { rep.River, err = e.river(ctx, rep.Pickup); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupThroughput) || cfg.runs(groupLag) {
		err := phase(groupThroughput, func() error {
			tp, lag, err := e.throughput(ctx, cfg.runs(groupThroughput))
			if cfg.runs(groupThroughput) || len(tp.Rows) > 0 {
				rep.Throughput = tp
			}
			if cfg.runs(groupLag) {
				rep.Lag = lag
			}
			return err
		})
		if err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupScale) {
		if err := phase(groupScale, func() (err error) { rep.Scale, err = e.scale(ctx); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupWebQueues) {
		if err := phase(groupWebQueues, func() (err error) { rep.WebQueues, err = e.webQueues(ctx); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupWebEvents) {
		if err := phase(groupWebEvents, func() (err error) { rep.WebEvents, err = e.webEvents(ctx); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupWebSubmit) {
		if err := phase(groupWebSubmit, func() (err error) { rep.WebSubmit, err = e.webSubmit(ctx); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupControl) {
		if err := phase(groupControl, func() (err error) { rep.Control, err = e.control(ctx, rep.Pickup); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupScheduling) {
		if err := phase(groupScheduling, func() (err error) { rep.Scheduling, err = e.scheduling(ctx, rep.Pickup, rep.Control); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupDashboard) {
		if err := phase(groupDashboard, func() (err error) { rep.Dashboard, err = e.dashboard(ctx); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupSupervise) {
		if err := phase(groupSupervise, func() (err error) { rep.Supervise, err = e.supervise(ctx, rep.Pickup); return err }); err != nil {
			return rep, err
		}
	}
	if cfg.runs(groupScaleout) {
		if err := phase(groupScaleout, func() (err error) { rep.Scaleout, err = e.scaleout(ctx); return err }); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// loadAverage is the machine's 1-minute load average, where /proc has it.
func loadAverage() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	l, err := strconv.ParseFloat(f[0], 64)
	return l, err == nil
}

// counts lists the task counts and durations the run used.
func counts(cfg config) []Count {
	var out []Count
	add := func(group, what string, v any) {
		if cfg.runs(group) || group == groupThroughput && cfg.runs(groupLag) {
			out = append(out, Count{Group: group, What: what, Value: v})
		}
	}
	add(groupPickup, "submit rate, tasks/s (one at a time)", cfg.PickupRate)
	add(groupPickup, "submit duration per run", cfg.PickupDuration.String())
	add(groupPickup, "warm-up tasks per run (not counted)", pickupWarmUp)
	add(groupPickup, "floor and node (change streams, majority)", "interleaved, 1 s of tasks to each in turn")
	add(groupThroughput, "tasks queued per node drain", cfg.Tasks)
	add(groupThroughput, "tasks queued per ceiling drain", cfg.CeilingTasks)
	add(groupThroughput, "drain timeout", cfg.DrainTimeout.String())
	add(groupScale, "backlogs", joinInts(cfg.Backlogs))
	add(groupScale, "TaskClaim calls per backlog", cfg.Claims)
	add(groupScale, fmt.Sprintf("TaskClaimMany(%d) calls per backlog", scaleBatch), manyCalls(cfg.Claims))
	add(groupScale, "tasks drained by the node per backlog", cfg.ScaleDrain)
	if cfg.ScaleTaskBytes > 0 {
		add(groupScale, "backlog tasks padded with", fmt.Sprintf("%d random bytes each (parameters.pad, binary)", cfg.ScaleTaskBytes))
	}
	add(groupScale, "node process RSS sampled for", cfg.RSSDuration.String())
	add(groupScaleout, "node processes per row", joinInts(cfg.ScaleoutNodes))
	add(groupScaleout, "each", fmt.Sprintf("this program's node subcommand, maxthreads %d, its own client and Go runtime; the queue paused until every one is ready; wake-up listeners %s", cfg.ScaleoutThreads, listenersSaid(cfg.ScaleoutListeners)))
	add(groupScaleout, "tasks drained per row", cfg.ScaleoutTasks)
	add(groupScaleout, "pickups per row", fmt.Sprintf("%d, one every %s, every process idle", cfg.ScaleoutPickups, scaleoutPickupGap))
	add(groupWebQueues, "queues, tasks", fmt.Sprintf("%d queues, %d tasks spread evenly, inserted raw (InsertMany of %d, %d at once, majority)", cfg.WebQueues, cfg.WebTasks, webQueuesInsertBatch, webQueuesInsertParallel))
	add(groupWebQueues, "counters", "count_todo and count_total set directly to the exact counts, as the projector keeps them; no node runs")
	add(groupWebQueues, "projected load", fmt.Sprintf("GET /queues %d/s open-loop for %s (a goroutine per request on one keep-alive pool; latency from the scheduled start)", cfg.WebRate, cfg.WebDuration))
	add(groupWebQueues, "one at a time", fmt.Sprintf("projected: %d requests; 4.103 way: the same route with the counters unset (3 count queries per queue), %d requests after 1 not counted", webSerial, cfg.WebSlow))
	add(groupWebQueues, "before timing", fmt.Sprintf("fsync (checkpoint) after the insert; %d concurrent requests to warm the pools", webWarmUp))
	add(groupWebQueues, "server", "web.NewHandler in-process on 127.0.0.1 (internal/httpserver), its own client")
	add(groupWebEvents, "subscribers", fmt.Sprintf("%d HTTP clients in this process on GET /api/v1/events?types=task&queue=ID, one live hub (defaults: buffer %d), reconnecting with Last-Event-ID", cfg.SSESubscribers, live.DefaultBuffer))
	add(groupWebEvents, "writer", fmt.Sprintf("raw loop, %d goroutines: guarded updateMany of %d tasks -2 -> -1, -1 -> 0, 0 -> 1 (majority), paced at %d transitions/s for %s; pre-images on", sseWriters, sseChunk, cfg.SSERate, cfg.SSEDuration))
	add(groupWebEvents, "lag", "receipt (blank line of the event read) - the writer's acknowledgement of that task's write; matched by task id and status")
	add(groupControl, "pickup floor", "the pickup group's when it ran, else measured first in this group the same way (--pickup-rate for --pickup-duration)")
	add(groupControl, "kill", fmt.Sprintf("%d kills, one at a time (%s apart), of shell tasks `exec sleep 60` on one in-process node, %d running per round (queue and node maxthreads); store.TaskKill by id on a client of its own (a command monitor times its request write); finishes seen on a change stream of the bench's own", cfg.KillSamples, killGap, killRunning))
	add(groupControl, "delayed tasks", fmt.Sprintf("%d tasks held until +%s (TaskInsertMany, not_before), then settling probes one at a time (due now+%s, not counted) until one starts within the goal (at most %s), then %d probes due now+%s..%s, one inserted every %s, into the same no-op queue of one in-process node; the held tasks deleted afterwards", cfg.DelayHeld, delayHeldFor, delayMin, delaySettleMax, cfg.DelayProbes, delayMin, delayMin+delaySpread, delayGap))
	add(groupControl, "wait", fmt.Sprintf("%d rounds: control.Wait (a client of its own) on %d tasks inserted running; after its first read, %d finished by one updateMany, the last %s later by another (majority); no node", cfg.WaitRounds, waitTasks, waitTasks-1, waitGap))
	add(groupDashboard, "overview", fmt.Sprintf("%d queues (priority 1, weight 30), %d node documents (20 queues each), %d tasks spread evenly and inserted raw as web-queues does, counters set as the projector keeps them; disbatch-web's handler in-process with its live hub; server time: %d requests a route, one at a time, after 1 not counted", cfg.DashQueues, dashNodes, cfg.DashTasks, dashServerN))
	add(groupDashboard, "browser", fmt.Sprintf("headless Chromium ($DISBATCH_CHROMIUM or Debian's chromium), 1280x900, a fresh profile: the overview's first contentful paint and the moment every queue's row is in the table (performance.now, from the navigation's start); then for %s queued tasks go claimed, running, succeeded by UpdateMany every 50 ms (%d transitions/s, one change event each) while the page is open: its events and coalesced renders (window.disbatchStats), its main thread's busy share (CDP Performance.getMetrics TaskDuration, ScriptDuration), and how long it takes to answer Runtime.evaluate(1), every 100 ms", cfg.DashDrain, dashDrainRate))
	add(groupSupervise, "starts", fmt.Sprintf("%d shell tasks each way, in turn: two in-process nodes (maxthreads %d) on databases of their own, --supervise off and on (a pool of %d idle disbatch-supervisor processes, built as make build builds it), each given a task (TaskInsertMany of one, majority) every %s, %s after the other's; timed from the insert's start to bash's $EPOCHREALTIME, the task's first command", cfg.SuperviseSamples, superviseThreads, supervisor.DefaultPool, superviseGap, superviseGap/2))
	add(groupSupervise, "memory", fmt.Sprintf("%d supervised `exec sleep 600` shell tasks at once on one in-process node; each supervisor's VmRSS and Pss (/proc/PID/smaps_rollup) once all run; then the supervisors are sent SIGTERM", cfg.SuperviseSleeping))
	add(groupScheduling, "pickup floor", "the pickup group's when it ran, else the control group's, else measured first in this group the same way")
	add(groupScheduling, "task graph edges", fmt.Sprintf("%d parent -> child pairs after %d not counted, one store.TaskInsertGraph of both every %s (majority), one fifo queue, one in-process node (maxthreads %d) and its leader's graph duty; times on this process's clock (the no-op plugin's calls), change events on a stream of the bench's own, attempts as the node recorded them", cfg.DAGEdges, dagWarmUp, secondFraction(cfg.PickupRate), cfg.MaxThreads))
	add(groupScheduling, "claimer passes", fmt.Sprintf("%d no-op tasks queued beforehand, spread evenly over 1 queue, then over %d queues (priority i %% %d, weight 1 + 37i %% 100), drained by one in-process node (queue and node maxthreads %d); claimer.Stats read once the node stopped (a pass is counted when it ends: when every slot is taken, every queue it tries is empty, or Stop ends it); drain timeout %s", cfg.SchedTasks, cfg.SchedQueues, schedPriorities, cfg.MaxThreads, cfg.DrainTimeout))
	add(groupScheduling, "max_running", fmt.Sprintf("%d no-op tasks queued beforehand in one queue, drained by %d in-process nodes (maxthreads %d each): no max_running, %d, %d; every status change replayed from a change stream (projected to id and status) until a write made after the nodes stopped; drain timeout %s", cfg.SchedTasks, schedCapNodes, cfg.MaxThreads, 2*schedCapNodes*cfg.MaxThreads, max(1, cfg.MaxThreads/4), cfg.DrainTimeout))
	add(groupWebSubmit, "tasks per submit, submits each way", fmt.Sprintf("%d, %d (after 1 of each not counted), alternating, into one queue", cfg.SubmitTasks, cfg.SubmitRepeats))
	return out
}

// listenersSaid says a WakeupListeners setting.
func listenersSaid(n int) string {
	if n <= 0 {
		return "every process"
	}
	return fmt.Sprintf("%d per queue (--scaleout-listeners)", n)
}
