package apiv1

import (
	"net/http"

	"github.com/disbatch-go/disbatch/store"
)

// Seed 002 (Taskman) names two "scheduler" routes that programs written
// for it call:
//
//	PUT /v1/scheduler/kill?id=a,b    start killing the tasks: the bulk kill of the v1 API
//	GET /v1/scheduler/wait?id=a,b    wait for the tasks to end: GET /api/v1/tasks/wait
//
// They answer as their v1 counterparts do (KillResult, WaitResult, the v1
// error shape). Seed 002 has no other /v1/ route this project serves, and
// Disbatch 4.103 has no /v1/ route at all.

// SchedulerPaths are the paths NewScheduler serves, for a mux to mount it
// at (each with every method: the handler answers 405 itself).
var SchedulerPaths = []string{"/v1/scheduler/kill", "/v1/scheduler/wait"}

// NewScheduler returns the handler of seed 002's scheduler routes.
func NewScheduler(o Options) http.Handler {
	h := newHandler(o)
	h.mount([]route{
		{method: "PUT", path: "/v1/scheduler/kill", query: []string{"id", "reason"}, serve: h.schedulerKill},
		{method: "GET", path: "/v1/scheduler/wait", query: []string{"id", "timeout"}, serve: h.taskWait},
	}, "no route %s; the scheduler routes are PUT /v1/scheduler/kill and GET /v1/scheduler/wait")
	return h
}

// schedulerKill is the bulk kill with its ids (and an optional reason) in
// the query.
func (h *handler) schedulerKill(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	ids, aerr := parseIDList(q, "id")
	if aerr != nil {
		return aerr
	}
	c := controlBody{target: store.TaskTarget{IDs: ids}}
	if s, ok, aerr := oneParam(q, "reason"); aerr != nil {
		return aerr
	} else if ok {
		if c.reason, aerr = checkReason(s, "reason", CodeInvalidParameter); aerr != nil {
			return aerr
		}
	}
	res, err := h.kill(r, c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}
