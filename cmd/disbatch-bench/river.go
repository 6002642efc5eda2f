package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// riverConditions are the River peer's: versions and settings.
type riverConditions struct {
	River         string `json:"river"`
	Postgres      string `json:"postgres"`
	FetchCooldown string `json:"fetch_cooldown"`
	MaxWorkers    int    `json:"max_workers"`
	Rate          int    `json:"rate_per_s"`
}

// riverDrain is the River peer's drain of a backlog.
type riverDrain struct {
	DrainJobs    int     `json:"drain_jobs"`
	DrainSeconds float64 `json:"drain_seconds"`
	DrainRate    float64 `json:"drain_jobs_per_s"`
}

// riverRun is what disbatch-bench-river writes: its conditions, every
// pickup (insert start -> Work) in ms, and its drain.
type riverRun struct {
	riverConditions
	PickupMS []float64 `json:"pickup_ms"`
	riverDrain
}

// RiverReport is the River peer group: disbatch-bench-river's figures
// (River on a throwaway PostgreSQL, on this machine, right after our
// pickup group) beside ours.
type RiverReport struct {
	riverConditions
	Pickup Latency `json:"pickup"`
	riverDrain
	// Ours: the node's pickup (change streams, majority) of this run, and
	// its ratio to River's, with the goal.
	Ours  Latency `json:"ours"`
	Ratio Ratio   `json:"ratio"`
	Goal  Goal    `json:"goal"`
}

// riverDir is where the peer's module lives, from the repository's root.
const riverDir = "cmd/disbatch-bench-river"

// river builds the River peer and runs it with the pickup group's rate and
// duration and the throughput group's task count (cancelled with ctx: it
// gets SIGTERM, and stops its PostgreSQL).
func (e *env) river(ctx context.Context, pickup *PickupReport) (*RiverReport, error) {
	dir := e.cfg.RiverDir
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return nil, fmt.Errorf("the River peer's module is not at %s (run disbatch-bench from the repository's root, or give --river-dir): %w", dir, err)
	}
	tmp, err := os.MkdirTemp("", "dsb-river-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	exe := filepath.Join(tmp, "disbatch-bench-river")
	build := exec.CommandContext(ctx, "go", "build", "-o", exe, ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the River peer in %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	args := []string{"--rate", strconv.Itoa(e.cfg.PickupRate), "--duration", e.cfg.PickupDuration.String(),
		"--jobs", strconv.Itoa(e.cfg.Tasks), "--max-workers", strconv.Itoa(e.cfg.MaxThreads)}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	e.log.Info("river: disbatch-bench-river "+strings.Join(args, " "), "dir", dir)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the River peer failed: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var run riverRun
	if err := json.Unmarshal(stdout.Bytes(), &run); err != nil {
		return nil, fmt.Errorf("the River peer's output %q: %w", stdout.String(), err)
	}
	return compareRiver(run, pickup), nil
}

// compareRiver sets River's run beside our node's pickup (change streams,
// majority submitter) of pickup. The goal is met only when both were
// measured and ours is at or below River's at p50 and p99.
func compareRiver(run riverRun, pickup *PickupReport) *RiverReport {
	d := make([]time.Duration, len(run.PickupMS))
	for i, v := range run.PickupMS {
		d[i] = time.Duration(v * float64(time.Millisecond))
	}
	rep := &RiverReport{riverConditions: run.riverConditions, Pickup: summarize(d), riverDrain: run.riverDrain}
	if r := pickupRow(pickup.Rows, modeChangeStream, wcMajority); r != nil {
		rep.Ours = r.Pickup
	}
	rep.Ratio = Ratio{What: "node pickup (change streams, majority) / River's (FetchCooldown " + rep.FetchCooldown + ")",
		P50: ratio(rep.Ours.P50, rep.Pickup.P50), P99: ratio(rep.Ours.P99, rep.Pickup.P99)}
	rep.Goal = Goal{Goal: "at or below River's pickup at p50 and p99 (issue 20)",
		Met: rep.Ours.N > 0 && rep.Pickup.N > 0 && rep.Ratio.P50 <= 1 && rep.Ratio.P99 <= 1}
	return rep
}

func renderRiver(b *strings.Builder, r *Report) {
	v := r.River
	if v == nil {
		return
	}
	t := table{title: fmt.Sprintf("PEER: RIVER %s on %s, one queue, MaxWorkers %d, FetchCooldown %s; pickup = insert start -> Work, %d/s one at a time (as ours: insert start -> plugin start)",
		v.River, v.Postgres, v.MaxWorkers, v.FetchCooldown, v.Rate),
		header: []string{"what", "n", "p50", "p95", "p99", "max"}}
	t.add("River pickup, ms", strconv.Itoa(v.Pickup.N), fms(v.Pickup.P50), fms(v.Pickup.P95), fms(v.Pickup.P99), fms(v.Pickup.Max))
	t.add("our node's pickup (this run's pickup group), ms", strconv.Itoa(v.Ours.N), fms(v.Ours.P50), fms(v.Ours.P95), fms(v.Ours.P99), fms(v.Ours.Max))
	t.render(b)
	fmt.Fprintf(b, "  %s: p50 %s, p99 %s; %s\n", v.Ratio.What, fx(v.Ratio.P50), fx(v.Ratio.P99), v.Goal.String())
	fmt.Fprintf(b, "  River drained %d no-op jobs in %.2f s: %s jobs/s (first Work to the last completed event)\n\n", v.DrainJobs, v.DrainSeconds, frate(v.DrainRate))
}

func (k *checker) river(v *RiverReport) {
	if v == nil {
		k.bad("river: missing")
		return
	}
	k.latency("river: pickup", v.Pickup)
	k.positive("river: drain jobs/s", v.DrainRate)
	k.latency("river: our pickup", v.Ours)
}
