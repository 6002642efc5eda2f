package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// RiverReport is the River peer group: disbatch-bench-river's figures
// (River on a throwaway PostgreSQL, on this machine, right after our
// pickup group) beside ours.
type RiverReport struct {
	River         string  `json:"river"`
	Postgres      string  `json:"postgres"`
	FetchCooldown string  `json:"fetch_cooldown"`
	MaxWorkers    int     `json:"max_workers"`
	Rate          int     `json:"rate_per_s"`
	Pickups       int     `json:"pickups"`
	PickupP50     float64 `json:"pickup_p50_ms"`
	PickupP95     float64 `json:"pickup_p95_ms"`
	PickupP99     float64 `json:"pickup_p99_ms"`
	PickupMax     float64 `json:"pickup_max_ms"`
	DrainJobs     int     `json:"drain_jobs"`
	DrainSeconds  float64 `json:"drain_seconds"`
	DrainRate     float64 `json:"drain_jobs_per_s"`
	// Ours: the node's pickup (change streams, majority) of this run, and
	// its ratio to River's, with the goal.
	Ours  Latency `json:"ours"`
	Ratio Ratio   `json:"ratio"`
	Goal  Goal    `json:"goal"`
}

// riverDir is where the peer's module lives, from the repository's root.
const riverDir = "cmd/disbatch-bench-river"

// river runs the River peer with the pickup group's rate and duration and
// the throughput group's task count, and sets it beside pickup's node row.
func (e *env) river(ctx context.Context, pickup *PickupReport) (*RiverReport, error) {
	dir := e.cfg.RiverDir
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return nil, fmt.Errorf("the River peer's module is not at %s (run disbatch-bench from the repository's root, or give --river-dir): %w", dir, err)
	}
	args := []string{"run", ".", "--rate", strconv.Itoa(e.cfg.PickupRate), "--duration", e.cfg.PickupDuration.String(),
		"--jobs", strconv.Itoa(e.cfg.Tasks), "--max-workers", strconv.Itoa(e.cfg.MaxThreads)}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	e.log.Info("river: go run "+strings.Join(args[2:], " "), "dir", dir)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the River peer failed: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	rep := &RiverReport{}
	if err := json.Unmarshal(stdout.Bytes(), rep); err != nil {
		return nil, fmt.Errorf("the River peer's output %q: %w", stdout.String(), err)
	}
	if pickup == nil {
		return rep, errors.New("the River peer needs this run's pickup group (--only pickup,...)")
	}
	for _, r := range pickup.Rows {
		if r.Mode == modeChangeStream && r.SubmitWC == wcMajority {
			rep.Ours = r.Pickup
		}
	}
	rep.Ratio = Ratio{What: "node pickup (change streams, majority) / River's (FetchCooldown " + rep.FetchCooldown + ")",
		P50: rep.Ours.P50 / rep.PickupP50, P99: rep.Ours.P99 / rep.PickupP99}
	rep.Goal = Goal{Goal: "at or below River's pickup at p50 and p99 (issue 20)", Met: rep.Ratio.P50 <= 1 && rep.Ratio.P99 <= 1}
	return rep, nil
}

func renderRiver(b *strings.Builder, r *Report) {
	v := r.River
	if v == nil {
		return
	}
	t := table{title: fmt.Sprintf("PEER: RIVER %s on %s, one queue, MaxWorkers %d, FetchCooldown %s; pickup = insert start -> Work, %d/s one at a time (as ours: insert start -> plugin start)",
		v.River, v.Postgres, v.MaxWorkers, v.FetchCooldown, v.Rate),
		header: []string{"what", "n", "p50", "p95", "p99", "max"}}
	t.add("River pickup, ms", strconv.Itoa(v.Pickups), fms(v.PickupP50), fms(v.PickupP95), fms(v.PickupP99), fms(v.PickupMax))
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
	k.positive("river: pickup p50", v.PickupP50)
	k.positive("river: pickup p99", v.PickupP99)
	k.positive("river: drain jobs/s", v.DrainRate)
	k.latency("river: our pickup", v.Ours)
}
