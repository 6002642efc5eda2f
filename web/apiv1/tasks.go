package apiv1

import (
	"errors"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// MaxSubmit bounds the tasks of one POST /api/v1/tasks.
const MaxSubmit = 10000

// List limits of GET /api/v1/tasks.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
	maxStatusFilters = 32
	maxParamFilters  = 32
	maxParamValues   = 32
)

func (h *handler) taskSubmit(w http.ResponseWriter, r *http.Request) error {
	v, aerr := h.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	o, aerr := asObject(v, nil, "queue", "tasks")
	if aerr != nil {
		return aerr
	}
	qv, qat, aerr := o.require("queue")
	if aerr != nil {
		return aerr
	}
	ref, aerr := wantString(qv, qat)
	if aerr != nil {
		return aerr
	}
	if ref == "" {
		return invalidField(qat, "want a queue's id or name, got an empty string")
	}
	tv, tat, aerr := o.require("tasks")
	if aerr != nil {
		return aerr
	}
	if tv.kind != kindArray {
		return invalidField(tat, "want an array of tasks, got %s", tv.describe())
	}
	if n := len(tv.arr); n == 0 || n > MaxSubmit {
		return invalidField(tat, "want 1 to %d tasks in one request, got %d", MaxSubmit, n)
	}
	params := make([]bson.Raw, len(tv.arr))
	controls := make([]store.TaskInsertControl, len(tv.arr))
	graphs := make([]graphBinding, len(tv.arr))
	graph := false
	for i, t := range tv.arr {
		to, aerr := asObject(t, tat.index(i), taskFields...)
		if aerr != nil {
			return aerr
		}
		pv, pat, aerr := to.require("params")
		if aerr != nil {
			return aerr
		}
		if params[i], aerr = paramsToBSON(pv, pat); aerr != nil {
			return aerr
		}
		if controls[i], aerr = bindTaskControl(to); aerr != nil {
			return aerr
		}
		if graphs[i], aerr = bindGraph(to); aerr != nil {
			return aerr
		}
		graph = graph || graphs[i].set
	}
	// Contradictions no schema can express, after every field is known
	// good (the OpenAPI document calls such a body valid: 409, not 400).
	for i, c := range controls {
		if !c.ExpiresAt.IsZero() && !c.NotBefore.IsZero() && !c.ExpiresAt.After(c.NotBefore) {
			return errorf(http.StatusConflict, CodeConflictingFields, tat.index(i).key("expires_at").String(),
				"expires_at (%s) is not after not_before (%s): the task could never run", c.ExpiresAt.Format(time.RFC3339Nano), c.NotBefore.Format(time.RFC3339Nano))
		}
	}
	q, err := h.queueByRef(r, ref, "queue")
	if err != nil {
		return err
	}
	if graph {
		return h.submitGraph(w, r, q, tat, params, controls, graphs)
	}
	ids, err := h.insertTasks(r, q.ID, params, controls)
	if err != nil {
		return err
	}
	out := struct {
		Queue string   `json:"queue"`
		IDs   []string `json:"ids"`
	}{Queue: q.ID.Hex(), IDs: make([]string, len(ids))}
	for i, id := range ids {
		out.IDs[i] = id.Hex()
	}
	return writeJSON(w, http.StatusCreated, out)
}

// taskFields are the fields of a task in POST /api/v1/tasks.
var taskFields = append([]string{"params", "timeout", "expires_at", "not_before", "priority"}, graphFields...)

// bindTaskControl reads a task's own time limit (seconds), expiry and
// delay.
func bindTaskControl(o object) (store.TaskInsertControl, *apiError) {
	var c store.TaskInsertControl
	var aerr *apiError
	if v, at, ok := o.get("timeout"); ok {
		if c.Timeout, aerr = wantSeconds(v, at); aerr != nil {
			return c, aerr
		}
	}
	if v, at, ok := o.get("expires_at"); ok {
		if c.ExpiresAt, aerr = wantTime(v, at); aerr != nil {
			return c, aerr
		}
	}
	if v, at, ok := o.get("not_before"); ok {
		if c.NotBefore, aerr = wantTime(v, at); aerr != nil {
			return c, aerr
		}
	}
	if v, at, ok := o.get("priority"); ok {
		if c.Priority, aerr = wantInt(v, at, 0, schema.MaxTaskPriority); aerr != nil {
			return c, aerr
		}
	}
	// In UTC, so that tasks with the same times go in one write.
	c.ExpiresAt, c.NotBefore = c.ExpiresAt.UTC(), c.NotBefore.UTC()
	return c, nil
}

// insertTasks inserts the tasks, each with its own control, in one
// transaction (all or none, whatever fails partway), with ids made here in
// submission order, so that _id order (fifo) is the order given.
func (h *handler) insertTasks(r *http.Request, queue bson.ObjectID, params []bson.Raw, controls []store.TaskInsertControl) ([]bson.ObjectID, error) {
	ids := make([]bson.ObjectID, len(params))
	for i := range ids {
		ids[i] = bson.NewObjectID()
	}
	p := store.TaskInsertManyParams{Queue: queue, IDs: ids, Parameters: params, Dialect4103: h.dialect, Atomic: true}
	p.TraceParent, p.TraceState = tracing.FromHeader(r.Header)
	for _, c := range controls {
		if c != (store.TaskInsertControl{}) {
			p.Controls = controls
			break
		}
	}
	if _, err := h.st.TaskInsertMany(r.Context(), p); err != nil {
		return nil, err
	}
	return ids, nil
}

var (
	statusPattern = regexp.MustCompile(`^-?(0|[1-9][0-9]{0,8})$`)
	digits        = regexp.MustCompile(`^[0-9]{1,9}$`)
	// paramFilter is a param[<path>] query parameter: dot-separated keys,
	// none empty or starting with '$', no NUL or brackets.
	paramFilter = regexp.MustCompile(`^param\[([^$.\x00\[\]][^.\x00\[\]]*(\.[^$.\x00\[\]][^.\x00\[\]]*)*)\]$`)
)

// parseStatus accepts a status name or an integer of at most 9 digits.
func parseStatus(s string) (schema.Status, bool) {
	if statusPattern.MatchString(s) {
		n, err := strconv.Atoi(s)
		return schema.Status(n), err == nil
	}
	for st := range statusNames {
		if st.String() == s {
			return st, true
		}
	}
	return 0, false
}

// parseTime accepts RFC 3339 (see parseRFC3339).
func parseTime(s, field string) (time.Time, *apiError) {
	t, ok := parseRFC3339(s)
	if !ok {
		return time.Time{}, errorf(http.StatusBadRequest, CodeInvalidParameter, field, "want an RFC 3339 date-time such as 2026-01-02T15:04:05Z, got %q", clip(s))
	}
	return t, nil
}

// paramValues are the values a param[...] filter matches: the string
// itself, and the number or boolean it spells.
func paramValues(s string) []any {
	vals := []any{s}
	switch s {
	case "true":
		return append(vals, true)
	case "false":
		return append(vals, false)
	}
	if v, err := parseJSON([]byte(s), 1); err == nil && v.kind == kindNumber && s == strings.TrimSpace(s) {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return append(vals, n)
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return append(vals, f)
		}
	}
	return vals
}

func (h *handler) taskList(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := store.TaskSearchParams{Limit: defaultListLimit}
	if ref, ok, aerr := oneParam(q, "queue"); aerr != nil {
		return aerr
	} else if ok {
		switch {
		case ref == "":
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "queue", "want a queue's id or name, got an empty string")
		case hexID.MatchString(ref):
			// An id need not name a queue that still exists: 4.103
			// leaves the tasks of a deleted queue.
			id, _ := bson.ObjectIDFromHex(ref)
			p.Queue = &id
		default:
			qu, err := h.queueByRef(r, ref, "queue")
			if err != nil {
				return err
			}
			p.Queue = &qu.ID
		}
	}
	if vs := q["status"]; len(vs) > 0 {
		if len(vs) > maxStatusFilters {
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "status", "at most %d statuses", maxStatusFilters)
		}
		for _, s := range vs {
			st, ok := parseStatus(s)
			if !ok {
				return errorf(http.StatusBadRequest, CodeInvalidParameter, "status",
					"want a status code (an integer of at most 9 digits) or one of orphaned, cancelled, blocked, terminated, queued, claimed, running, succeeded, failed; got %q", clip(s))
			}
			p.Statuses = append(p.Statuses, st)
		}
	}
	if node, ok, aerr := oneParam(q, "node"); aerr != nil {
		return aerr
	} else if ok {
		if node == "" {
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "node", "want a node name, got an empty string")
		}
		p.Node = node
	}
	if reason, ok, aerr := oneParam(q, "reason"); aerr != nil {
		return aerr
	} else if ok {
		if !slices.Contains(schema.Reasons, reason) {
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "reason", "want one of %s, got %q", strings.Join(schema.Reasons, ", "), clip(reason))
		}
		p.Reason = reason
	}
	for _, b := range []struct {
		name string
		dst  *time.Time
	}{{"created_after", &p.CreatedAfter}, {"created_before", &p.CreatedBefore}} {
		s, ok, aerr := oneParam(q, b.name)
		if aerr != nil {
			return aerr
		}
		if ok {
			t, aerr := parseTime(s, b.name)
			if aerr != nil {
				return aerr
			}
			*b.dst = t
		}
	}
	if s, ok, aerr := oneParam(q, "order"); aerr != nil {
		return aerr
	} else if ok {
		switch s {
		case "asc":
		case "desc":
			p.Descending = true
		default:
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "order", "want asc or desc, got %q", clip(s))
		}
	}
	if s, ok, aerr := oneParam(q, "limit"); aerr != nil {
		return aerr
	} else if ok {
		n, err := strconv.Atoi(s)
		if err != nil || !digits.MatchString(s) || n < 1 || n > maxListLimit {
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "limit", "want an integer from 1 to %d, got %q", maxListLimit, clip(s))
		}
		p.Limit = n
	}
	if s, ok, aerr := oneParam(q, "cursor"); aerr != nil {
		return aerr
	} else if ok {
		id, aerr := objectID(s, "cursor")
		if aerr != nil {
			aerr.msg = "want the next of a previous page, got " + strconv.Quote(clip(s))
			return aerr
		}
		p.After = id
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		vs := q[name]
		m := paramFilter.FindStringSubmatch(name)
		switch {
		case m == nil && strings.HasPrefix(name, "param["):
			return errorf(http.StatusBadRequest, CodeInvalidParameter, name,
				"want param[<key>] with a key, or dot-separated keys for nested objects, none empty or starting with '$', without NUL or brackets")
		case m == nil:
			continue
		case len(vs) > maxParamValues:
			return errorf(http.StatusBadRequest, CodeInvalidParameter, name, "at most %d values for one parameter", maxParamValues)
		case len(p.Params) == maxParamFilters:
			return errorf(http.StatusBadRequest, CodeInvalidParameter, name, "at most %d param[...] filters", maxParamFilters)
		}
		match := store.ParamMatch{Path: m[1]}
		for _, v := range vs {
			match.Values = append(match.Values, paramValues(v)...)
		}
		p.Params = append(p.Params, match)
	}
	res, err := h.st.TaskSearch(r.Context(), p)
	if err != nil {
		return err
	}
	for _, m := range res.Malformed {
		h.log.Warn("skipping a task document that cannot be read", "error", m)
	}
	out := struct {
		Tasks   []Task  `json:"tasks"`
		Next    *string `json:"next"`
		Skipped int     `json:"skipped"`
	}{Tasks: make([]Task, 0, len(res.Tasks)), Skipped: len(res.Malformed)}
	for _, t := range res.Tasks {
		v, err := taskView(t)
		if err != nil {
			return err
		}
		out.Tasks = append(out.Tasks, v)
	}
	if res.More {
		next := res.Last.Hex()
		out.Next = &next
	}
	return writeJSON(w, http.StatusOK, out)
}

func (h *handler) taskGet(w http.ResponseWriter, r *http.Request) error {
	id, aerr := objectID(r.PathValue("id"), "id")
	if aerr != nil {
		return aerr
	}
	res, err := h.st.TaskSearch(r.Context(), store.TaskSearchParams{IDs: []bson.ObjectID{id}, Limit: 1})
	switch {
	case err != nil:
		return err
	case len(res.Malformed) > 0:
		return res.Malformed[0]
	case len(res.Tasks) == 0:
		return errorf(http.StatusNotFound, CodeNotFound, "id", "no task %s", id.Hex())
	}
	v, err := taskView(res.Tasks[0])
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, v)
}

// taskOutput streams a task's stdout or stderr as text, from the task
// document or chunk by chunk from GridFS. Content-Length is set, so a
// stream cut short by a failed read is seen as such by the client.
func (h *handler) taskOutput(name string) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, aerr := objectID(r.PathValue("id"), "id")
		if aerr != nil {
			return aerr
		}
		out, err := h.st.TaskOutputOpen(r.Context(), store.TaskOutputOpenParams{ID: id, Name: name})
		switch {
		case errors.Is(err, store.ErrOutputMissing):
			h.log.Warn("a task's output file is missing from GridFS", "task_id", id.Hex(), "output", name, "error", err)
			return errorf(http.StatusNotFound, CodeNotFound, name, "the %s of task %s is a GridFS file that is missing", name, id.Hex())
		case errors.Is(err, store.ErrNotFound):
			return errorf(http.StatusNotFound, CodeNotFound, "id", "no task %s", id.Hex())
		case err != nil:
			return err
		}
		defer out.Close()
		hd := w.Header()
		hd.Set("Content-Type", "text/plain; charset=utf-8")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Cache-Control", "no-store")
		hd.Set("Content-Length", strconv.FormatInt(out.Size, 10))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return nil
		}
		// A large output to a slow client outlasts the server's write
		// timeout, which would cut it: lifted, each write gets a
		// deadline of its own instead (a client that stops reading is
		// still let go).
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		dw := &deadlineWriter{w: w, rc: rc, each: outputWriteTimeout}
		if _, err := io.Copy(dw, out); err != nil && r.Context().Err() == nil {
			// The status is sent: the short body (against Content-Length)
			// tells the client.
			h.log.Error("streaming a task's output failed", "task_id", id.Hex(), "output", name, "error", err)
		}
		return nil
	}
}

// outputWriteTimeout bounds each write of a task's output to the client.
const outputWriteTimeout = 30 * time.Second

// deadlineWriter gives each write to w a deadline of its own, each from
// its start.
type deadlineWriter struct {
	w    io.Writer
	rc   *http.ResponseController
	each time.Duration
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.each))
	return d.w.Write(p)
}
