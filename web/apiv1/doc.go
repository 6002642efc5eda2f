// Package apiv1 is the v1 JSON API of disbatch-web: one http.Handler that
// serves full paths under /api/v1/ (mount it at "/api/v1/"), built from
// Options (a Store, the allowed plugins, the event stream's handler).
// openapi.json, served at /api/v1/openapi.json, describes every route,
// parameter, body and response precisely; the tests check every response
// the handlers give against it.
//
// # Routes
//
//	GET    /api/v1/openapi.json         this API's OpenAPI 3.1 document
//	GET    /api/v1/queues               {"queues":[Queue],"skipped":n}
//	POST   /api/v1/queues               201 Queue (409 when the name is taken)
//	GET    /api/v1/queues/{queue}       Queue ({queue}: id or name)
//	PATCH  /api/v1/queues/{queue}       Queue after the change
//	DELETE /api/v1/queues/{queue}       with its tasks and output; 409 with unfinished tasks unless ?force=true
//	GET    /api/v1/tasks                {"tasks":[Task],"next":cursor|null,"skipped":n}
//	POST   /api/v1/tasks                {"queue":ref,"tasks":[{"params":{…}}…]}: 201 {"queue":id,"ids":[…]}
//	POST   /api/v1/tasks/kill           {"ids":[…]} or {"filter":{…}}, "reason": KillResult
//	POST   /api/v1/tasks/cancel         the same: CancelResult
//	POST   /api/v1/tasks/retry          {"ids"|"filter", "dry_run"}: RetryResult
//	GET    /api/v1/tasks/wait           ?id=a,b&timeout=30s: WaitResult when all ended or at the timeout
//	GET    /api/v1/tasks/{id}           Task
//	POST   /api/v1/tasks/{id}/kill      optional {"reason"}: KillResult (404 unknown, 409 not changed)
//	POST   /api/v1/tasks/{id}/cancel    optional {"reason"}: CancelResult
//	POST   /api/v1/tasks/{id}/retry     optional {"dry_run"}: RetryResult
//	GET    /api/v1/tasks/{id}/stdout    text/plain, streamed (from GridFS when stored there)
//	GET    /api/v1/tasks/{id}/stderr    text/plain, streamed
//	GET    /api/v1/nodes                {"nodes":[Node],"skipped":n}
//	GET    /api/v1/nodes/{node}         Node ({node}: name, or the id of its document)
//	PATCH  /api/v1/nodes/{node}         {"maxthreads":n|null}: Node
//	POST   /api/v1/nodes/{node}/drain   Node
//	GET    /api/v1/events               Server-Sent Events (Options.Events, web/live)
//
// NewScheduler serves seed 002's PUT /v1/scheduler/kill?id=a,b and GET
// /v1/scheduler/wait?id=a,b, which answer as the bulk kill and the wait do.
//
// # Decisions
//
//   - Errors have one shape, {"error":{"code","message","field"}} (see the
//     Code constants), also for unknown routes (404) and methods (405, with
//     Allow). Invalid input is refused before anything is written.
//   - Bodies must be application/json (charset utf-8 if any; else 415),
//     at most MaxBodyBytes (413), and are parsed strictly by this package's
//     parser: one value, UTF-8, no duplicate keys, no unknown fields, at
//     most 128 levels deep, every problem reported with its path
//     (tasks[3].params.user). Unknown query parameters are refused too.
//   - Names follow the document's patterns: 1 to 256 characters, no
//     control characters, no white space at either end; a queue name may
//     not be 24 hex digits.
//   - Task parameters: see params.go (order kept, numbers, refused keys).
//   - Queue counts never cost a query per queue: queued, finished and
//     total come from the queue's projected counters (null until a node
//     has created them), running from one aggregation over the claimed
//     and running tasks of all queues (store.TaskRunningCounts).
//   - Task control (control.go, wait.go): kills, cancels and retries are
//     the store's guarded writes; a request by ids lists the tasks it left
//     alone (skipped, with why) and answers 200, a request for one task
//     answers 404 or 409 instead. The records they leave name the
//     authenticated user (by), or anonymous. Contradicting fields that no
//     schema can express (expires_at not after not_before, a backoff's
//     max below its base) are 409 conflicting_fields, not 400: the
//     document calls the body valid, and a 400 would say it is not.
//   - A wait lifts the HTTP server's read and write deadlines for its own
//     timeout (at most 300 s) and answers done false when it passes.
//   - Task listings page by _id (GET /api/v1/tasks?cursor=<next>), so
//     inserts never shift a page, and never read output text: store's
//     TaskSearch has the server compute its length.
package apiv1
