// Package supervisor runs one task's process plugin (exec, shell, an
// external executable) in a small process of its own, detached from the
// node, so that a node can stop, crash or be upgraded without killing the
// task (think containerd's shim).
//
// The node (package node, through Launcher and Handle) starts
// `disbatch-supervisor <dir> <id>` in a session of its own, listening on
// <dir>/<id>.sock, or takes an idle one from its pool (started as
// pool-<pid>-<n>, warmed, waiting until the node gives it a task or goes;
// the node renames its socket and log to the task's). Its first message
// is the task and its Spec. The supervisor starts the plugin's process
// first, then keeps the spec in <dir>/<id>.spec (for a restarted node and
// the finish command) and says hello. It runs the process as the node
// prepared it (plugin.Detachable's
// Prepare: a plugin/proc Command, so this package links neither BSON nor
// the plugins) in a process group of its own, capturing its output, under
// the node's plugin timeout and the task's own time limit, and answers the
// node's messages: alive (an acknowledged heartbeat), kill (task control,
// a fence, a second signal) and ack (the node wrote the finish). When the
// process ends it writes how (Outcome: the raw proc.Result, which the
// node reads with the plugin's Interpret, package supervisor/finish) to
// <dir>/<id>.result and tells the node; if no node is
// connected it writes the guarded finish to MongoDB itself
// ({_id, node, status: 0}, the same write the node makes), so a result is
// never lost while the node is away. It then removes its files and exits.
//
// A node that starts (the same --node name, the same state directory)
// finds the sockets, connects, and re-adopts its running tasks before it
// settles its previous run's leftovers; they are left out of that.
//
// # The timing argument without the node
//
// The node fences itself when no heartbeat was acknowledged for
// FenceAfter, measured from when it sent the last acknowledged one; other
// nodes declare it dead when the server's clock passes that heartbeat's
// timestamp + DeadAfter, and DeadAfter - FenceAfter ≥ node.FenceMargin
// (see node's liveness). A supervisor keeps the same rule on the node's
// behalf: every acknowledged heartbeat reaches it as alive(sent), the
// node's send time, read from the same host's clock, and it kills its
// plugin's process group when its clock passes sent + FenceAfter (checked
// every 100 ms) unless a later alive came. The heartbeat's timestamp is
// the server's clock when the write was applied, after it was sent, so
// the kill comes before any node may declare the node dead and recover
// the task: nothing runs twice, whether the node is stopped, killed,
// partitioned or never comes back. A node that restarts within FenceAfter
// sends alive again on its first heartbeat and its tasks never notice.
// The argument compares only one host's wall clock with itself and the
// server's clock with itself; a step of the host's wall clock (not a slew)
// while the node is away shortens or lengthens the wait by the step.
//
// A fenced supervisor does not write a finish: the task belongs to
// whoever recovers it. It waits up to DeadAfter for a node to adopt it
// (which then finishes it as failed, the way a fenced node's kills are)
// and exits.
package supervisor
