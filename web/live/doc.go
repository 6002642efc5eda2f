// Package live serves GET /api/v1/events of disbatch-web: task transitions
// and queue and node changes, as Server-Sent Events, as they commit.
//
// A Hub follows one change stream of the database (store profile
// StreamTransitions; never polling) and fans its events out to every
// subscriber: it is a service (Start, Stop) and the endpoint's
// http.Handler. Task status changes are read from what the change events
// say of the task before the change: the write's own schema.TaskPrior
// (every write of ours that moves a task) or the pre-image. The counter
// projector keeps pre-images on only while other programs write tasks
// (it turns them on at their first change, which is the one without
// either): such an update then says "from": null and "queue": null, and
// goes to the subscribers of every queue (which it concerns cannot be
// told). The
// hub reads whether the tasks collection keeps them every
// Options.PreImagesCheck (10 s) and asks its streams for them only while
// it does, reopening its stream where it was when that changes: asked
// for, the server looks one up for every update, found or not.
//
// # Request
//
//	GET /api/v1/events?queue=<id|name>&task=<id>&types=task,queue,node
//	Last-Event-ID: <id>
//
// The parameters, all optional:
//
//   - queue: only task events of these queues (a task moved between queues
//     matches either) and queue events of these queues. Repeatable, or
//     comma-separated (a value that is one queue's whole name, commas and
//     all, is that queue). An id is 24 hex digits; a name is resolved
//     once, at connection, when the server has a Lookup (otherwise names
//     are refused).
//   - task: only task events of these tasks (ObjectIds). Repeatable, or
//     comma-separated.
//   - types: the kinds of events wanted, a comma-separated subset of task,
//     queue and node. Without it: all three, except that task= alone asks
//     for task events only and queue= for task and queue events.
//   - Different parameters combine with AND, the values of one parameter
//     with OR. Other parameters are ignored.
//   - Last-Event-ID (the header a browser's EventSource sends when it
//     reconnects), or the parameter last_event_id for clients that cannot
//     set headers (the header wins): resume just after that id.
//
// A bad parameter is answered 400 with Content-Type application/json and
// the v1 error shape {"error":{"code":"invalid_parameter","message":…,
// "field":"queue"}} (field: queue, task, types, last_event_id or
// Last-Event-ID). 503 {"error":{"code":"unavailable",…}} while the hub is
// not running; 405 for methods other than GET.
//
// # Response
//
// 200, Content-Type text/event-stream, Cache-Control no-cache,
// X-Accel-Buffering no (and Connection close on HTTP/1.1: a stream's
// connection is not reused). It starts with a "retry: 2000" line (the
// reconnection delay, in milliseconds) and an "id:" line, the position
// it starts from (the one it resumes from, or the present's), so that a
// client cut off or dropped before its first event still resumes without
// loss (once the server has read its first batch of changes). From the moment the response
// headers are sent, every change committed afterwards is delivered (and
// maybe some committed just before: the stream runs a few milliseconds
// behind the commits). Then events, each
//
//	id: <id>
//	event: <task|queue|node|reset>
//	data: <one line of JSON>
//	<blank line>
//
// and, every 15 s, a comment ": keep-alive", which may be followed by an
// "id: <id>" line alone: the stream's position moved on past events the
// client did not ask for; that id is what a resume should start from
// (browsers take it as their last event id without dispatching an event).
//
// Ids are opaque strings (base64url of a change stream resume token): a
// position in the database's change history just after the event. Resume
// from them; do not compare them: two connections may give one event
// different ids (the last event of a batch the server sends gets the
// batch's end position, which may lie a little further on). An event is
// identified by its data: "id", "op" and "cluster_time" (and, in a
// transaction that changes a document twice, its place). Events come in
// commit order; a transaction's changes come one after the other, with
// the same cluster time.
//
// # Event data
//
// Common to task, queue and node events:
//
//   - "type": task, queue or node (as the event name);
//   - "op": insert, update, replace or delete;
//   - "id": the document's _id (an ObjectId as 24 hex digits);
//   - "time": the commit's wall-clock time (RFC 3339, nanoseconds, UTC);
//   - "cluster_time": {"t": seconds, "i": increment}, the commit's
//     cluster time, which orders events.
//
// task: a transition. "queue" (the task's queue after the change; before
// it for a delete), "from" and "to" (status codes: -2 queued, -1 claimed,
// 0 running, 1 succeeded, 2 failed, …; "from" is null for an insert or
// when not known, "to" null for a delete), "node" (the node holding the
// task after the change, null when unclaimed), and "from_queue" when the
// task moved to another queue.
//
//	{"type":"task","op":"update","id":"…","time":"2025-01-02T03:04:05.678Z",
//	 "cluster_time":{"t":1735787045,"i":3},"queue":"…","from":-2,"to":-1,"node":"n1"}
//
// A change of a task's node alone (from == to) is a transition too.
//
// queue: "name" (null when not known), "fields" (an object of the fields
// inserted, replaced or set by the update, as relaxed extended JSON: name,
// constructor, plugin, maxthreads, threads, sort, nodes_pin, …) and
// "removed" (the fields an update removed). The counters count_todo,
// count_total, count_running and count_failed are never part of it, and an
// update of nothing but them is not an event: they follow from the task
// events, and the counter projector rewrites them with every batch of
// transitions (read them with GET on the queue).
//
//	{"type":"queue","op":"update","id":"…","time":"…","cluster_time":{…},
//	 "name":"q1","fields":{"maxthreads":4,"threads":4}}
//
// node: "node" (its name; null when not known), and those of "state"
// (running, draining, stopped), "drain", "maxthreads" (null: no cap) and
// "dead" that the change sets (all four for an insert or replace; a field
// an update removed is null, or false for drain and dead). Heartbeats are
// not events.
//
//	{"type":"node","op":"update","id":"…","time":"…","cluster_time":{…},
//	 "node":"n1","drain":true}
//
// # reset
//
// event: reset says the stream cannot say what changed during a span:
// the position resumed from is too old (the server's change history, its
// oplog, has rolled past it), is not of this deployment, or the hub's own
// stream lost its position; or the tasks, queues or nodes collection (or
// the database) was dropped or renamed. Its id is the position the stream
// goes on from; the client must re-read the state it shows and then apply
// the events that follow.
//
//	{"type":"reset","reason":"change history lost: …","message":"events were lost: …"}
//
// # lagged
//
// A client that falls behind by more than the buffer (default 1024
// events) is sent, best effort, an event lagged without an id, and
// disconnected; it never slows the other clients:
//
//	event: lagged
//	data: {"type":"lagged","message":"…","resume":"<id>"}
//
// "resume" is the last id the client was sent: reconnecting with it as
// Last-Event-ID goes on without loss (EventSource does that by itself).
//
// # Resuming
//
// A resume starts just after the given id: without loss or duplicate,
// across a restart of the server too (ids are positions in the database's
// change history, not in the server's memory). A recent id is served from
// the hub's memory; an older one by a replay of the history for that
// client, which hands the client over to the hub's stream as soon as it
// has caught up. When the server stops, streams end; clients reconnect
// with their last id.
package live
