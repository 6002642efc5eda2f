// Package reaper recovers tasks whose node went away (seed 000's orphans,
// seed 003's dead workers).
//
// At start-up, before the node claims anything, the node's own tasks in -1
// (claimed) or 0 (running) were left by a previous run of the same node and
// become orphaned (-6) (OrphanOwn). The cluster-wide sweeps run on one node,
// the holder of the "leader" lease (package leadership; Lead is the duty),
// every interval:
//
//   - any task claimed (-1) whose mtime is older than OrphanAfter (default
//     5 minutes) becomes orphaned: a claim is turned into a run within
//     milliseconds, so an old claim means its node died between the two;
//   - any node whose heartbeat is older than DeadAfter (default 30 s) is
//     declared dead (dead: true on its document): its claimed tasks go back
//     to the queue (they never started) and its running tasks become
//     orphaned (they may have had effects; seed 000 leaves re-running them
//     to the operator). See store.NodesDeadRecover for why this happens
//     exactly once even when two nodes sweep at once (a deposed leader
//     that has not noticed yet).
//
// Ages are judged by the server's clock ($$NOW), never the node's. Every
// update is guarded by the status it expects, so a task that moved on
// meanwhile is left alone.
package reaper
