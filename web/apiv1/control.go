package apiv1

import (
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/auth"
)

// Task control: kill, cancel and retry, of one task by its path or of
// many by ids or a filter. The store's guarded writes decide what changes
// (store.TaskKill, TaskCancel, TaskRetry); these handlers check the
// request first, so that an invalid one changes nothing.

// The actions Options.Controlled is told of.
const (
	// ActionKillRequested: running or claimed tasks whose node was asked
	// to kill them.
	ActionKillRequested = "kill_requested"
	// ActionCancelled: queued or held tasks finished unrun (by a kill or a
	// cancel).
	ActionCancelled = "cancelled"
	// ActionSettled: orphaned tasks finished as killed.
	ActionSettled = "settled"
	// ActionRequeued: finished or orphaned tasks queued again.
	ActionRequeued = "requeued"
)

// Actions lists the Action constants.
var Actions = []string{ActionKillRequested, ActionCancelled, ActionSettled, ActionRequeued}

// Anonymous is who asks, in the records a request leaves ({kill: {by}}),
// when authentication is off.
const Anonymous = "anonymous"

// maxReasonLength bounds the reason a client gives for a kill or cancel,
// in characters.
const maxReasonLength = 1024

// Skipped is a task of a request by ids that the request left alone.
type Skipped struct {
	ID  string `json:"id"`
	Why string `json:"why"`
}

// KillResult is what a kill did.
type KillResult struct {
	// Requested: running or claimed; their node kills them and finishes
	// them failed with reason killed.
	Requested int64 `json:"requested"`
	// Cancelled: queued or held, finished unrun at once.
	Cancelled int64 `json:"cancelled"`
	// Settled: orphaned, finished as killed.
	Settled int64 `json:"settled"`
	// DryRun: the counts are what would be done; nothing was changed
	// (absent otherwise: the answer as it was before dry_run).
	DryRun  bool      `json:"dry_run,omitempty"`
	Skipped []Skipped `json:"skipped"`
	skips   []store.TaskSkip
}

// CancelResult is what a cancel did, or with dry_run would do.
type CancelResult struct {
	Cancelled int64     `json:"cancelled"`
	DryRun    bool      `json:"dry_run,omitempty"`
	Skipped   []Skipped `json:"skipped"`
	skips     []store.TaskSkip
}

// RetryResult is what a retry did, or with dry_run would do.
type RetryResult struct {
	Requeued int64 `json:"requeued"`
	// Reblocked: descendants of the requeued tasks that had ended with
	// parent_failed, held again awaiting their parents (0 with dry_run).
	Reblocked int64     `json:"reblocked"`
	DryRun    bool      `json:"dry_run"`
	Skipped   []Skipped `json:"skipped"`
	skips     []store.TaskSkip
}

func skippedView(in []store.TaskSkip) []Skipped {
	out := make([]Skipped, len(in))
	for i, s := range in {
		out[i] = Skipped{ID: s.ID.Hex(), Why: s.Why}
	}
	return out
}

// by names who asks: the authenticated principal, else Anonymous.
func by(r *http.Request) string {
	if p, ok := auth.FromContext(r.Context()); ok && p.Name != "" {
		return p.Name
	}
	return Anonymous
}

// controlBody is a bound body of a control request.
type controlBody struct {
	target store.TaskTarget
	// queueRef is the filter's queue, looked up after the body is checked.
	queueRef string
	reason   string
	dryRun   bool
}

// bindControl binds the body of a request by ids or filter: fields are
// ids or filter (one of them), and the extras the route takes (reason,
// dry_run).
func bindControl(v value, extras ...string) (controlBody, *apiError) {
	o, aerr := asObject(v, nil, append([]string{"ids", "filter"}, extras...)...)
	if aerr != nil {
		return controlBody{}, aerr
	}
	var c controlBody
	iv, iat, hasIDs := o.get("ids")
	fv, fat, hasFilter := o.get("filter")
	switch {
	case hasIDs && hasFilter:
		return c, errorf(http.StatusBadRequest, CodeInvalidField, "", "give ids or a filter, not both")
	case !hasIDs && !hasFilter:
		return c, errorf(http.StatusBadRequest, CodeMissingField, "ids", "name the tasks: give ids (at most %d) or a filter", store.MaxControlIDs)
	case hasIDs:
		if c.target.IDs, aerr = wantIDs(iv, iat); aerr != nil {
			return c, aerr
		}
	default:
		if c.target.Filter, c.queueRef, aerr = bindFilter(fv, fat); aerr != nil {
			return c, aerr
		}
	}
	if c.reason, aerr = bindReason(o); aerr != nil {
		return c, aerr
	}
	if dv, dat, ok := o.get("dry_run"); ok {
		if c.dryRun, aerr = wantBool(dv, dat); aerr != nil {
			return c, aerr
		}
	}
	return c, nil
}

// bindReason reads an optional reason: at most maxReasonLength
// characters, no control characters.
func bindReason(o object) (string, *apiError) {
	v, at, ok := o.get("reason")
	if !ok {
		return "", nil
	}
	s, aerr := wantString(v, at)
	if aerr != nil {
		return "", aerr
	}
	return checkReason(s, at.String(), CodeInvalidField)
}

// checkReason checks a reason given in a body field or query parameter.
func checkReason(s, field, code string) (string, *apiError) {
	if n := utf8.RuneCountInString(s); n > maxReasonLength {
		return "", errorf(http.StatusBadRequest, code, field, "want at most %d characters, got %d", maxReasonLength, n)
	}
	if strings.ContainsFunc(s, isControl) {
		return "", errorf(http.StatusBadRequest, code, field, "must not contain control characters")
	}
	return s, nil
}

// wantIDs accepts 1 to store.MaxControlIDs task ids and drops repeats.
func wantIDs(v value, at path) ([]bson.ObjectID, *apiError) {
	if v.kind != kindArray {
		return nil, invalidField(at, "want an array of task ids, got %s", v.describe())
	}
	if n := len(v.arr); n == 0 || n > store.MaxControlIDs {
		return nil, invalidField(at, "want 1 to %d task ids, got %d; select more tasks with a filter", store.MaxControlIDs, n)
	}
	ids := make([]bson.ObjectID, 0, len(v.arr))
	seen := make(map[bson.ObjectID]bool, len(v.arr))
	for i, e := range v.arr {
		s, aerr := wantString(e, at.index(i))
		if aerr != nil {
			return nil, aerr
		}
		id, aerr := objectID(s, "")
		if aerr != nil {
			return nil, invalidField(at.index(i), "%s", aerr.msg)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// maxFilterStatuses bounds filter.status.
const maxFilterStatuses = 32

// bindFilter binds a filter; its queue (a name or an id) is returned for
// the caller to look up.
func bindFilter(v value, at path) (*store.TaskFilter, string, *apiError) {
	o, aerr := asObject(v, at, "queue", "status", "reason", "node", "since", "until")
	if aerr != nil {
		return nil, "", aerr
	}
	if len(o.members) == 0 {
		return nil, "", invalidField(at, "an empty filter would select every task; give at least one of queue, status, reason, node, since, until")
	}
	f := &store.TaskFilter{}
	var queue string
	for _, m := range o.members {
		mat := at.key(m.key)
		switch m.key {
		case "queue":
			if queue, aerr = wantString(m.val, mat); aerr != nil {
				return nil, "", aerr
			}
			if queue == "" {
				return nil, "", invalidField(mat, "want a queue's id or name, got an empty string")
			}
		case "status":
			if m.val.kind != kindArray {
				return nil, "", invalidField(mat, "want an array of statuses, got %s", m.val.describe())
			}
			if n := len(m.val.arr); n == 0 || n > maxFilterStatuses {
				return nil, "", invalidField(mat, "want 1 to %d statuses, got %d", maxFilterStatuses, n)
			}
			for i, e := range m.val.arr {
				st, aerr := wantStatus(e, mat.index(i))
				if aerr != nil {
					return nil, "", aerr
				}
				if !slices.Contains(f.Statuses, st) {
					f.Statuses = append(f.Statuses, st)
				}
			}
		case "reason":
			s, aerr := wantString(m.val, mat)
			if aerr != nil {
				return nil, "", aerr
			}
			if !slices.Contains(schema.Reasons, s) {
				return nil, "", invalidField(mat, "want one of %s, got %q", strings.Join(schema.Reasons, ", "), clip(s))
			}
			f.Reason = s
		case "node":
			s, aerr := wantString(m.val, mat)
			if aerr != nil {
				return nil, "", aerr
			}
			if msg := checkNodeName(s); msg != "" {
				return nil, "", invalidField(mat, "the node name %s", msg)
			}
			f.Node = s
		case "since", "until":
			t, aerr := wantTime(m.val, mat)
			if aerr != nil {
				return nil, "", aerr
			}
			if m.key == "since" {
				f.Since = t
			} else {
				f.Until = t
			}
		}
	}
	return f, queue, nil
}

// wantStatus accepts a status code (an integer) or a status's name.
func wantStatus(v value, at path) (schema.Status, *apiError) {
	const want = "want a status code (an integer) or one of orphaned, cancelled, blocked, terminated, queued, claimed, running, succeeded, failed"
	switch v.kind {
	case kindNumber:
		n, aerr := wantInt(v, at, -1<<31, 1<<31-1)
		if aerr != nil {
			return 0, aerr
		}
		return schema.Status(n), nil
	case kindString:
		for st := range statusNames {
			if st.String() == v.s {
				return st, nil
			}
		}
		return 0, invalidField(at, "%s, got %q", want, clip(v.s))
	}
	return 0, invalidField(at, "%s, got %s", want, v.describe())
}

// resolve looks up the filter's queue by name or id: an id need not name a
// queue that still exists (its tasks may), a name must.
func (h *handler) resolve(r *http.Request, c *controlBody) error {
	if c.queueRef == "" {
		return nil
	}
	if hexID.MatchString(c.queueRef) {
		c.target.Filter.Queue, _ = bson.ObjectIDFromHex(c.queueRef)
		return nil
	}
	q, err := h.queueByRef(r, c.queueRef, "filter.queue")
	if err != nil {
		return err
	}
	c.target.Filter.Queue = q.ID
	return nil
}

// readControl reads and binds the body of a request by ids or filter.
func (h *handler) readControl(w http.ResponseWriter, r *http.Request, extras ...string) (controlBody, error) {
	v, aerr := h.readBody(w, r)
	if aerr != nil {
		return controlBody{}, aerr
	}
	c, aerr := bindControl(v, extras...)
	if aerr != nil {
		return c, aerr
	}
	return c, h.resolve(r, &c)
}

// readOne reads the path's task id and the optional body of a request for
// one task, with the fields the route takes.
func (h *handler) readOne(w http.ResponseWriter, r *http.Request, fields ...string) (bson.ObjectID, controlBody, error) {
	id, aerr := objectID(r.PathValue("id"), "id")
	if aerr != nil {
		return id, controlBody{}, aerr
	}
	var c controlBody
	v, ok, aerr := h.readOptionalBody(w, r)
	if aerr != nil {
		return id, c, aerr
	}
	if ok {
		o, aerr := asObject(v, nil, fields...)
		if aerr != nil {
			return id, c, aerr
		}
		if c.reason, aerr = bindReason(o); aerr != nil {
			return id, c, aerr
		}
		if dv, dat, ok := o.get("dry_run"); ok {
			if c.dryRun, aerr = wantBool(dv, dat); aerr != nil {
				return id, c, aerr
			}
		}
	}
	c.target.IDs = []bson.ObjectID{id}
	return id, c, nil
}

// oneSkipped is a request for one task that left it alone: 404 when the
// task does not exist, else 409.
func oneSkipped(id bson.ObjectID, skipped []store.TaskSkip, what string) error {
	switch {
	case len(skipped) == 0:
		return nil
	case skipped[0].Code == store.SkipMissing:
		return errorf(http.StatusNotFound, CodeNotFound, "id", "no task %s", id.Hex())
	}
	return errorf(http.StatusConflict, CodeTaskState, "id", "task %s was not %s: %s", id.Hex(), what, skipped[0].Why)
}

func (h *handler) kill(r *http.Request, c controlBody) (KillResult, error) {
	res, err := h.st.TaskKill(r.Context(), store.TaskKillParams{Target: c.target, By: by(r), Reason: c.reason, DryRun: c.dryRun})
	if !c.dryRun {
		// Count what was written even when a later step failed.
		h.controlled(ActionKillRequested, res.Requested)
		h.controlled(ActionCancelled, res.Cancelled)
		h.controlled(ActionSettled, res.Settled)
	}
	if err != nil {
		return KillResult{}, err
	}
	return KillResult{Requested: res.Requested, Cancelled: res.Cancelled, Settled: res.Settled, DryRun: c.dryRun, Skipped: skippedView(res.Skipped), skips: res.Skipped}, nil
}

func (h *handler) taskKillMany(w http.ResponseWriter, r *http.Request) error {
	c, err := h.readControl(w, r, "reason", "dry_run")
	if err != nil {
		return err
	}
	res, err := h.kill(r, c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (h *handler) taskKill(w http.ResponseWriter, r *http.Request) error {
	id, c, err := h.readOne(w, r, "reason", "dry_run")
	if err != nil {
		return err
	}
	res, err := h.kill(r, c)
	if err != nil {
		return err
	}
	if err := oneSkipped(id, res.skips, "killed"); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (h *handler) cancel(r *http.Request, c controlBody) (CancelResult, error) {
	res, err := h.st.TaskCancel(r.Context(), store.TaskCancelParams{Target: c.target, By: by(r), Reason: c.reason, DryRun: c.dryRun})
	if !c.dryRun {
		h.controlled(ActionCancelled, res.Cancelled)
	}
	if err != nil {
		return CancelResult{}, err
	}
	return CancelResult{Cancelled: res.Cancelled, DryRun: c.dryRun, Skipped: skippedView(res.Skipped), skips: res.Skipped}, nil
}

func (h *handler) taskCancelMany(w http.ResponseWriter, r *http.Request) error {
	c, err := h.readControl(w, r, "reason", "dry_run")
	if err != nil {
		return err
	}
	res, err := h.cancel(r, c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (h *handler) taskCancel(w http.ResponseWriter, r *http.Request) error {
	id, c, err := h.readOne(w, r, "reason", "dry_run")
	if err != nil {
		return err
	}
	res, err := h.cancel(r, c)
	if err != nil {
		return err
	}
	if err := oneSkipped(id, res.skips, "cancelled"); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (h *handler) retry(r *http.Request, c controlBody) (RetryResult, error) {
	res, err := h.st.TaskRetry(r.Context(), store.TaskRetryParams{Target: c.target, By: by(r), DryRun: c.dryRun})
	if !c.dryRun {
		h.controlled(ActionRequeued, res.Requeued)
	}
	if err != nil {
		return RetryResult{}, err
	}
	return RetryResult{Requeued: res.Requeued, Reblocked: res.Reblocked, DryRun: c.dryRun, Skipped: skippedView(res.Skipped), skips: res.Skipped}, nil
}

func (h *handler) taskRetryMany(w http.ResponseWriter, r *http.Request) error {
	c, err := h.readControl(w, r, "dry_run")
	if err != nil {
		return err
	}
	res, err := h.retry(r, c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func (h *handler) taskRetry(w http.ResponseWriter, r *http.Request) error {
	id, c, err := h.readOne(w, r, "dry_run")
	if err != nil {
		return err
	}
	res, err := h.retry(r, c)
	if err != nil {
		return err
	}
	if err := oneSkipped(id, res.skips, "requeued"); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}
