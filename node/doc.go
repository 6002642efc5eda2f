// Package node composes a Disbatch execution node (DEN) from parts with one
// job each, and owns their start-up and shutdown order:
//
//   - claimer (package claimer): claims on wake-ups and ticks, and counts
//     the tasks the node holds against the queues' and the node's limits;
//   - runner (runner.go): runs each claimed task through its plugin, with a
//     kill switch per task; what happens to a task is told to its trace and
//     metrics (observe.go), not kept in the runner;
//   - liveness (liveness.go): the heartbeat, the fence watchdog, drain and
//     the operator's maxthreads, acting on the rest of the node through a
//     small interface (livenessTarget);
//   - strays (strays.go): hands back claims whose answer was lost (never
//     a task whose plugin ran: one whose result is not yet written stays
//     the runner's, runner.settle);
//   - queues (queues.go): which queues the node serves;
//   - the change-stream wake-ups (package events) on a bus (bus.go), the
//     counter projector (package projections), and the cluster-wide duties
//     of the reaper on the holder of the "leader" lease (package
//     leadership).
//
// Start-up: ensure indexes; orphan this node's leftovers (reaper); open the
// change stream (events); join the election of the counter projector
// (projections); read the queues; write the first heartbeat (reading the
// operator's maxthreads) and start liveness; start the stray-claim sweep
// and stand for the leader lease; then start the claimer, whose first pass
// tries every queue. The stream opens before the claimer's first pass, so a
// task inserted in between is seen either by the pass or by the stream.
//
// Shutdown (Stop), in reverse: stop claiming at once; hand back tasks
// claimed but not started (node -1, status -2); let running tasks finish
// within Grace, then kill them and mark them failed with the reason; step
// down as leader; write a last heartbeat (state stopped); leave the
// projector's election; close the stream (saving its position, killing its
// server cursor).
package node
