// Package projections folds task state transitions seen on the change
// stream into the counters seed 000 makes the node responsible for: the
// queues' count_todo and count_total and the per-node tasks_todo,
// tasks_doing and tasks_done, applied exactly once across many nodes.
package projections
