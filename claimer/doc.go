// Package claimer claims queued tasks for a node with seed 000's
// findOneAndUpdate, within the queues' per-node maxthreads and the node's
// maxthreads, when a wake-up says a queue may have work.
//
// Wake-ups come from the events bus (a task inserted or put back in a
// queue, a queue changed, a rescan), from the node when one of its tasks
// finishes (a slot is free), and from a jittered tick (1 s by default) that
// is the correctness fallback: it re-reads the queues and tries every one.
// Wake-ups are debounced: the first fires at once, the ones that arrive
// while a pass runs merge into one more pass.
//
// A wake-up for queue Q claims in Q only. A queue whose last claim found
// nothing is not asked again because a slot freed up; only an event that
// says it has work, or the tick, does that.
//
// A pass reads the queues (when one changed, and on the tick), then
// claims. Tasks claimed in a queue whose change was heard after that read
// (by the time the claim answered) are dispatched with the queues read
// again; a change heard only later is not covered. A change that moved
// only a queue's admissions under max_running (a release, a capped claim)
// wakes the queue and reads nothing again: its settings stand.
//
// A queue's listeners hear of each new task: every node serving it, or
// with Config.Listeners (disbatchd's --wakeup-listeners, 3 by default)
// the few ranked first by a hash of their names among those whose last
// heartbeat says they have a stream, those without a free slot for it
// last, the others
// letting their streams go (Config.Quiet) and finding work by the tick. So that the listeners do
// not all race for a task, each ranks itself among them for that task
// (rendezvous hashing on the task's id and the nodes' names) and tries
// rank x Config.Stagger later, 2 ms a rank: the first with a free slot
// takes it alone. A backlog is shared out the same way: a node's batched
// claim reads a batch per node serving the queue (as far as
// store.MaxClaimBatch candidates) and takes first the tasks it
// ranks first for (Prefer), so that nodes claiming at once seldom try
// for the same tasks; the queue's order is loosened within that read.
// Not for capped queues (their claims are transactions) nor queues
// sorted by priority (a node would take its own lower-priority tasks
// first). Nodes whose batched claims were contended all the same spread
// the next ones over more candidates (Spread).
package claimer
