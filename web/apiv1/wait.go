package apiv1

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/control"
	"github.com/disbatch-go/disbatch/store"
)

// Waiting for tasks: GET /api/v1/tasks/wait (and seed 002's
// /v1/scheduler/wait) holds the request until every task named has ended
// (control.Wait: a change stream on exactly those tasks), or until its
// timeout, and answers their states either way.

// Wait timeouts.
const (
	DefaultWaitTimeout = 30 * time.Second
	MaxWaitTimeout     = 300 * time.Second
	// waitSlack is how long past its timeout a wait may take to answer:
	// the last read of the tasks' states (control.Wait gives it 15 s).
	waitSlack = 30 * time.Second
)

// waitTimeoutPattern is the timeout parameter, 0 to 300 s exactly as the
// OpenAPI document has it: seconds (a unit s or none), milliseconds (ms)
// or minutes (m), fractions allowed.
var waitTimeoutPattern = regexp.MustCompile(`^(?:(?:300(?:\.0+)?|(?:[12][0-9]{2}|[1-9]?[0-9])(?:\.[0-9]+)?)s?|(?:300000(?:\.0+)?|(?:[12][0-9]{5}|[1-9][0-9]{0,4}|0)(?:\.[0-9]+)?)ms|(?:5(?:\.0+)?|[0-4](?:\.[0-9]+)?)m)$`)

// parseWaitTimeout reads the timeout parameter.
func parseWaitTimeout(s string) (time.Duration, *apiError) {
	bad := func() *apiError {
		return errorf(http.StatusBadRequest, CodeInvalidParameter, "timeout",
			"want a time from 0 to 300 s such as 30s, 1.5s, 500ms or 2m (a number alone is seconds), got %q", clip(s))
	}
	if !waitTimeoutPattern.MatchString(s) {
		return 0, bad()
	}
	num, unit := s, time.Second
	switch {
	case strings.HasSuffix(s, "ms"):
		num, unit = strings.TrimSuffix(s, "ms"), time.Millisecond
	case strings.HasSuffix(s, "s"):
		num = strings.TrimSuffix(s, "s")
	case strings.HasSuffix(s, "m"):
		num, unit = strings.TrimSuffix(s, "m"), time.Minute
	}
	f, err := strconv.ParseFloat(num, 64)
	d := time.Duration(f * float64(unit))
	if err != nil || d < 0 || d > MaxWaitTimeout {
		return 0, bad()
	}
	return d, nil
}

// idList is the id parameter: comma-separated task ids, 1 to
// store.MaxControlIDs of them.
var idList = regexp.MustCompile(`^[0-9a-f]{24}(,[0-9a-f]{24})*$`)

// parseIDList reads a comma-separated list of task ids and drops repeats.
func parseIDList(q url.Values, name string) ([]bson.ObjectID, *apiError) {
	s, ok, aerr := oneParam(q, name)
	switch {
	case aerr != nil:
		return nil, aerr
	case !ok:
		return nil, errorf(http.StatusBadRequest, CodeInvalidParameter, name, "%s is required: comma-separated task ids", name)
	case !idList.MatchString(s):
		return nil, errorf(http.StatusBadRequest, CodeInvalidParameter, name,
			"want task ids (24 lower-case hex digits each) separated by commas, got %q", clip(s))
	}
	parts := strings.Split(s, ",")
	if len(parts) > store.MaxControlIDs {
		return nil, errorf(http.StatusBadRequest, CodeInvalidParameter, name, "%d task ids; at most %d in one request", len(parts), store.MaxControlIDs)
	}
	ids := make([]bson.ObjectID, len(parts))
	for i, p := range parts {
		ids[i], _ = bson.ObjectIDFromHex(p)
	}
	ids, err := control.CheckIDs(ids)
	if err != nil {
		return nil, errorf(http.StatusBadRequest, CodeInvalidParameter, name, "%v", err)
	}
	return ids, nil
}

// WaitResult is where the tasks of a wait stand.
type WaitResult struct {
	// Done: every task has ended (finished, orphaned, or not found);
	// false when the timeout came first.
	Done bool `json:"done"`
	// Succeeded: every task was found and succeeded (status 1).
	Succeeded bool        `json:"succeeded"`
	Tasks     []WaitState `json:"tasks"`
}

// WaitState is one task of a wait.
type WaitState struct {
	ID         string  `json:"id"`
	Found      bool    `json:"found"`
	Status     *int    `json:"status"`
	StatusName *string `json:"status_name"`
	Reason     *string `json:"reason"`
}

func waitView(states []store.TaskState) WaitResult {
	out := WaitResult{Done: true, Succeeded: control.Succeeded(states), Tasks: make([]WaitState, len(states))}
	for i, st := range states {
		v := WaitState{ID: st.ID.Hex(), Found: st.Found}
		if st.Found {
			n := int(st.Status)
			v.Status = &n
			if statusNames[st.Status] {
				name := st.Status.String()
				v.StatusName = &name
			}
			if st.Reason != "" {
				v.Reason = &st.Reason
			}
		}
		out.Done = out.Done && control.Ended(st)
		out.Tasks[i] = v
	}
	return out
}

func (h *handler) taskWait(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	ids, aerr := parseIDList(q, "id")
	if aerr != nil {
		return aerr
	}
	timeout := DefaultWaitTimeout
	if s, ok, aerr := oneParam(q, "timeout"); aerr != nil {
		return aerr
	} else if ok {
		if timeout, aerr = parseWaitTimeout(s); aerr != nil {
			return aerr
		}
	}
	// The server's timeouts (30 s by default) would cut a longer wait: its
	// write deadline, and its read deadline, which (as web/live notes) may
	// cancel the request when net/http's background read hits it.
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(timeout + waitSlack)
	_ = rc.SetReadDeadline(deadline)
	_ = rc.SetWriteDeadline(deadline)

	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	states, err := control.Wait(ctx, h.st, ids)
	cancel()
	switch {
	case err == nil:
	case r.Context().Err() != nil:
		return r.Context().Err() // the client went away
	case ctx.Err() == nil && !errors.Is(err, control.ErrWaitTimeout):
		return err
	}
	return writeJSON(w, http.StatusOK, waitView(states))
}
