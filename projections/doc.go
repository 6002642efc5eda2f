// Package projections keeps the counters seed 000 makes the nodes
// responsible for, count_todo and count_total on every queue,
// count_running (seed 001's cluster-wide "pending", for scheduling by
// weight) and count_failed (the failed tasks, for the dashboard), as
// projections of task state transitions seen on a change stream, not as
// recounts. The per-node stats of the heartbeat (tasks_todo, tasks_done)
// are derived from them; tasks_doing is each node's own count.
//
// # Definitions
//
// count_total is the number of tasks in the queue; count_todo the number
// with status <= 0, exactly as {$lte: ["$status", 0]} counts it (a missing
// status counts as to do, a non-numeric one does not); count_running the
// number with status -1 (claimed) or 0 (running), on any node, as
// {$or: [{$eq: ["$status", -1]}, {$eq: ["$status", 0]}]} counts it (-1.0
// or a decimal 0 count; a missing, null or non-numeric status does not);
// count_failed the number with status 2 (failed, for any reason), as
// {$eq: ["$status", 2]} counts it (2.0 or a decimal 2 count). Running
// tasks are also to do. A transition changes them: an insert adds one to
// total (and to todo when <= 0, to running when -1 or 0, to failed when
// 2); a status change across 0 moves one in or out of todo, one into or
// out of {-1, 0} (a claim -2 → -1, a finish 0 → 1, a requeue -1 → -2; a
// start -1 → 0 changes nothing) moves one in or out of running, and one
// into or out of 2 (a finish 0 → 2, a retry 2 → -2) one in or out of
// failed; a delete takes one off (off todo, running and failed too when it
// was counted there); a task moved to another queue counts for both. Tasks
// written by anyone count: our CLI, Perl tools, a raw insertMany or
// deleteMany.
//
// count_running lags like the others (by a batch), so it serves what needs
// a share, the claimer's order by weight, never a cap: a cap needs a write
// that conflicts (docs/scheduling.md, max_running).
//
// # Applied once, with N nodes
//
// Every node runs a Service, but only one applies: the holder of the lease
// document "projector" in disbatch_leases, elected by package leadership.
// The lease expires by the server's clock ($$NOW), is renewed every
// LeaseTTL/4, and carries an epoch that goes up whenever the owner changes.
// The leader follows its own change stream over tasks and queues (the
// store's reader, profile store.StreamCounters) and applies events in
// order, in batches. Each queue's document carries how far in the stream
// its counters go (counts_applied: the last applied event's resume token,
// which sorts in the stream's order, and its cluster time). A batch is one
// unordered bulk write, one round trip (store.CountersAdvance): for each
// queue it touched, one update that adds its deltas to the four counters
// and moves counts_applied to the batch's last event, only where
// counts_applied is still what this term last saw there. That
// compare-and-set is the fence, queue by queue: a queue's counters move
// only with its position, so however a deposed leader's late batch and
// its successor's interleave, an event is counted once in each queue. A
// leader whose write (or background recount) finds a queue moved by
// another term takes the position it found and recounts the queue,
// holding it out of the batches until then (a recount's write is a transaction fenced by the lease: a
// deposed leader's fails, and its term ends). About once a second the leader writes the batch's resume
// token into the lease document, fenced by its epoch, as the checkpoint
// (in the background: no batch waits for it, only a recount's sets, which
// write it too; and not while queues are still to be recounted); a
// successor resumes there and skips, queue by queue, the events its
// counters already hold. Nothing is applied twice or missed. (Until stop
// 54 each batch was a transaction of three round trips, the lease's fence
// and checkpoint with the counters: the lag a batch waits for its write
// is about a third of what it was; docs/scaling.md.) Readers see each
// queue's counters move on their own: a task moved between two queues may
// show in both, or in neither, until the other queue's update lands. The
// next batch is read while one is written (one batch ahead, dropped when
// the stream is reopened, which it always is from what was applied).
//
// # Old status: the writes' own word, and pre-images
//
// A transition needs the status (and queue) before the change. Every write
// of ours that moves a task (claims, starts, finishes, hand-backs, the
// timers' releases and expiries, kills, cancels, retries, recovery, the
// settling of task graphs) writes it into the task (schema.TaskPrior),
// and the store gives its change events a ChangeEvent.Before made from
// it (a conformance test follows every such path). Any other change of a
// task's status or queue — Disbatch 4.103's nodes and tools, a shell —
// and every replace and delete needs a pre-image: the tasks collection's changeStreamPreAndPostImages,
// which the stream asks for (fullDocumentBeforeChange: whenAvailable).
// Pre-images cost MongoDB a copy of the task before each update (in
// config.system.preimages, until it falls out of the oplog window) and a
// read of it per event: about a fifth of a node's server time
// (docs/scaling.md). So the leader keeps them on only while they are
// needed: a term starts with them on; after Config.PreImagesIdle (10
// minutes) in which no such change came, it turns them off; the first
// one turns them on again. An event that has neither its pre-image nor
// TaskPrior (that first one, one written while they were off, one whose
// pre-image expired) cannot be applied exactly, so the projector
// reconciles all queues instead; a reason such an event wrote is not
// counted (Stats.Reasons). The alternatives were worse: updateLookup
// gives the document after the change, not before; remembering statuses
// in memory is lost with the node.
//
// # Reconcile
//
// On gaining the lease (once caught up with the stream), after the stream's
// history was lost, when a queue's counters are missing — any of the four:
// a queue created by a client, or by Disbatch 4.103 which never writes
// them, or one from before count_running or count_failed, which thus gets
// it — and every ReconcileEvery (10 minutes), the projector recounts with
// one aggregation read as a snapshot at the cluster time of the last event
// it applied, so the recount and the counters describe the same moment
// (every queue at a term's start and every ReconcileEvery; the queues
// concerned otherwise), once a batch held all there was (a reply cut
// short can end inside a transaction).
// Differences in any of the four are logged as drift with the queue and
// both values of each (drift should be zero; any is a bug to chase) and
// repaired. A queue
// missing a counter is not drift: the recount creates it (and sets the
// others). A queue set gets the recount's moment as its position, so no
// event the recount holds is counted again there: the stream goes on
// after that moment, and the rest of a transaction whose events a batch
// cut in two (they share its moment) is skipped for the queues set. A
// queue left as it was matched the recount, so that rest adds nothing to
// it. Without a usable position
// (no checkpoint, lost history, a snapshot too old) it recounts at the
// present and starts the stream at that time.
//
// A term's catch-up recount and the periodic one, when no queue is marked
// and no event went unplaced, are read in the background while the
// batches go on (background.go): the batches record what they add to each
// queue after its moment, and the recount is compared with the counters
// less that; the term is steady once its catch-up recount is compared.
// Every other recount (marked queues, every queue after an event it could
// not place) runs between two batches, which wait for it; a marked
// queue's reads only its own tasks' index entries.
//
// # Lag
//
// For every event the projector records the time from the change (the
// event's wall time) to the commit of its batch; Stats reports p50 and p99
// over the last events.
package projections
