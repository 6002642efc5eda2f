// Package ui is the live web dashboard of disbatch-web: one page of
// HTML, CSS and JavaScript, embedded in the binary (no CDN, no build
// step, no npm package: plain modern JavaScript the browser runs as is),
// that reads the v1 API and follows /api/v1/events.
//
// # Paths
//
//	GET /                 the overview (queues, nodes, leases), live
//	GET /ui/queues/{name} a queue: its tasks, filters, bulk actions, settings
//	GET /ui/tasks/{id}    a task: parameters, attempts, output, control, graph
//	GET /ui/nodes         the nodes: drain, maxthreads, what each runs
//	GET /ui/submit        submit JSON lines, checked before inserting
//	GET /ui/assets/...    the embedded files
//
// Every other path under /ui/ answers the page too (the script routes it,
// and says when it knows no such page). 4.103's own pages keep their
// paths: its queue browser is /index.html, its task query form GET /tasks
// for a browser; GET /balance for a browser is this dashboard's balance
// editor, which reads and writes 4.103's balance document through
// 4.103's GET and POST /balance.
//
// The page is told who the user is (the principal of web/auth, or admin
// when authentication is off) and shows only the actions that role may
// take; the server refuses the others anyway.
package ui
