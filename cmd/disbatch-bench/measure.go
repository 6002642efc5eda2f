package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"
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

	phase := func(name string, fn func() error) error {
		start := time.Now()
		err := fn()
		log.Info("phase done", "phase", name, "took", time.Since(start).Round(time.Millisecond), "total", time.Since(begin).Round(time.Second))
		return err
	}
	if cfg.runs(groupPickup) {
		if err := phase(groupPickup, func() (err error) { rep.Pickup, err = e.pickup(ctx); return err }); err != nil {
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
	return rep, nil
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
	add(groupScale, "node process RSS sampled for", cfg.RSSDuration.String())
	return out
}
