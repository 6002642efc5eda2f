// Package metrics exposes one node's metrics in the Prometheus text format.
//
// A Metrics is a registry of its own (never the global one) holding:
//
//   - the task lifecycle, as node.Observer: disbatch_tasks_claimed_total
//     {queue}, disbatch_task_pickup_seconds{queue} (a histogram of ctime →
//     running), disbatch_tasks_finished_total{queue,status} (status as the
//     number: "1", "2", …) and disbatch_task_run_seconds{queue};
//   - what the node knows, read at scrape time from a Source (a *node.Node):
//     disbatch_queue_tasks{queue,state="todo"|"done"|"running"|"failed"}
//     from the queues' projected counters (running: count_running,
//     cluster-wide, part of todo; failed: count_failed, part of done),
//     disbatch_node_tasks_running{queue} (this node's),
//     disbatch_claims_total, disbatch_claim_passes_total{trigger="wakeup"|
//     "tick"}, disbatch_change_stream_{events,resumes,rescans}_total,
//     disbatch_projector_leader, disbatch_projection_lag_seconds{quantile},
//     disbatch_projection_events_total,
//     disbatch_projection_drift_queues_total and
//     disbatch_projection_{recounts,recount_failures}_total;
//   - the Go runtime and process collectors (go_*, process_*).
//
// Serve runs an HTTP server with /metrics, /healthz (200 while the process
// runs) and /readyz (200 once the node has started, 503 before and while it
// stops). It is off unless an address is given; a bare port (":9464" or
// "9464") binds 127.0.0.1 only, so exposing the metrics takes an explicit
// "0.0.0.0:9464".
package metrics
