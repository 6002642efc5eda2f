// Package node composes a Disbatch execution node (DEN): the change-stream
// events, the claimer, the runner that executes claimed tasks through
// plugins, the heartbeat and the reaper, and owns their start-up and
// shutdown order.
//
// Start-up: ensure indexes; orphan this node's leftovers (reaper); open the
// change stream (events); join the election of the counter projector
// (projections); write the first heartbeat (reading the operator's
// maxthreads); then start the claimer, whose first pass tries every queue.
// The stream opens before the claimer's first pass, so a task inserted in
// between is seen either by the pass or by the stream.
//
// Shutdown (Stop): stop claiming at once; hand back tasks claimed but not
// started (node -1, status -2); let running tasks finish within Grace, then
// kill them and mark them failed with the reason; write a last heartbeat;
// close the stream (saving its resume token).
package node
