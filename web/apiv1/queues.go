package apiv1

import (
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// queueFields are the writable fields of a queue, in the order of the
// document.
var queueFields = []string{"name", "plugin", "maxthreads", "sort", "nodes_pin", "nodes_ignore", "timeout", "retries", "retry_backoff", "rerun_orphans",
	"priority", "weight", "max_getwork", "max_running", "paused", "continuous", "interval", "then", "config"}

// maxNodeList bounds nodes_pin and nodes_ignore.
const maxNodeList = 1000

// queueChange is a bound queue body: nil leaves a field alone.
type queueChange struct {
	name, plugin          *string
	setMaxThreads         bool
	maxThreads            *int
	sort                  *schema.Sort
	nodesPin, nodesIgnore *[]string
	// Task control: timeout (0 removes it), retries, backoff, rerun_orphans.
	timeout      *time.Duration
	retries      *int
	retryBackoff *schema.Backoff
	rerunOrphans *bool
	// Scheduling (docs/scheduling.md).
	priority, weight       *float64
	maxGetwork, maxRunning *int
	paused, continuous     *bool
	interval               *time.Duration
	then                   *string
	config                 bson.Raw
	fieldsSet              int
}

// control reports whether the change sets any of the control fields.
func (c queueChange) control() bool {
	return c.timeout != nil || c.retries != nil || c.retryBackoff != nil || c.rerunOrphans != nil
}

// sched reports whether the change sets any of the scheduling fields.
func (c queueChange) sched() bool {
	return c.priority != nil || c.weight != nil || c.maxGetwork != nil || c.maxRunning != nil || c.paused != nil ||
		c.continuous != nil || c.interval != nil || c.then != nil || c.config != nil
}

// checkThen answers 409 (conflict with the stored state) when then names
// no queue.
func (h *handler) checkThen(r *http.Request, c queueChange) error {
	if c.then == nil || *c.then == "" {
		return nil
	}
	ok, err := h.st.QueueNamed(r.Context(), *c.then)
	if err != nil || ok {
		return err
	}
	return errorf(http.StatusConflict, CodeConflict, "then", "then: no queue is named %q", clip(*c.then))
}

// update is the change as the store takes it.
func (c queueChange) update(id bson.ObjectID) store.QueueUpdateParams {
	return store.QueueUpdateParams{ID: id, Name: c.name, Constructor: c.plugin,
		SetMaxThreads: c.setMaxThreads, MaxThreads: c.maxThreads, Sort: c.sort, NodesPin: c.nodesPin, NodesIgnore: c.nodesIgnore,
		Timeout: c.timeout, Retries: c.retries, RetryBackoff: c.retryBackoff, RerunOrphans: c.rerunOrphans,
		Priority: c.priority, Weight: c.weight, MaxGetwork: c.maxGetwork, MaxRunning: c.maxRunning, Paused: c.paused,
		Continuous: c.continuous, Interval: c.interval, Then: c.then, Config: c.config}
}

func (h *handler) bindQueue(v value) (queueChange, *apiError) {
	o, err := asObject(v, nil, queueFields...)
	if err != nil {
		return queueChange{}, err
	}
	var c queueChange
	for _, m := range o.members {
		at := path{}.key(m.key)
		c.fieldsSet++
		switch m.key {
		case "name":
			s, err := wantString(m.val, at)
			if err != nil {
				return c, err
			}
			if msg := checkQueueName(s); msg != "" {
				return c, invalidField(at, "the queue name %s", msg)
			}
			c.name = &s
		case "plugin":
			s, err := wantString(m.val, at)
			if err != nil {
				return c, err
			}
			if msg := checkName(s); msg != "" {
				return c, invalidField(at, "the plugin name %s", msg)
			}
			if len(h.plugins) > 0 && !slices.Contains(h.plugins, s) {
				return c, invalidField(at, "unknown plugin %q; the plugins are %s", clip(s), strings.Join(h.plugins, ", "))
			}
			c.plugin = &s
		case "maxthreads":
			n, err := wantMaxThreads(m.val, at)
			if err != nil {
				return c, err
			}
			c.setMaxThreads, c.maxThreads = true, n
		case "sort":
			s, err := wantString(m.val, at)
			if err != nil {
				return c, err
			}
			sort := schema.Sort(s)
			if s == "" || !sort.Valid() {
				return c, invalidField(at, "want %s, got %q", schema.SortNames, clip(s))
			}
			c.sort = &sort
		case "nodes_pin", "nodes_ignore":
			list, err := wantStrings(m.val, at, maxNodeList, func(s string) string {
				if msg := checkNodeName(s); msg != "" {
					return "a node name " + msg
				}
				return ""
			})
			if err != nil {
				return c, err
			}
			if m.key == "nodes_pin" {
				c.nodesPin = &list
			} else {
				c.nodesIgnore = &list
			}
		case "timeout":
			d, err := wantSeconds(m.val, at)
			if err != nil {
				return c, err
			}
			c.timeout = &d
		case "retries":
			n, err := wantInt(m.val, at, 0, schema.MaxRetries)
			if err != nil {
				return c, err
			}
			c.retries = ptrTo(int(n))
		case "retry_backoff":
			b, err := bindBackoff(m.val, at)
			if err != nil {
				return c, err
			}
			c.retryBackoff = &b
		case "rerun_orphans":
			b, err := wantBool(m.val, at)
			if err != nil {
				return c, err
			}
			c.rerunOrphans = &b
		case "priority", "weight":
			f, err := wantNumber(m.val, at, -math.MaxFloat64, math.MaxFloat64)
			if err != nil {
				return c, err
			}
			if m.key == "priority" {
				c.priority = &f
			} else {
				c.weight = &f
			}
		case "max_getwork", "max_running":
			n, err := wantInt(m.val, at, 0, math.MaxInt32)
			if err != nil {
				return c, err
			}
			if m.key == "max_getwork" {
				c.maxGetwork = ptrTo(int(n))
			} else {
				c.maxRunning = ptrTo(int(n))
			}
		case "paused", "continuous":
			b, err := wantBool(m.val, at)
			if err != nil {
				return c, err
			}
			if m.key == "paused" {
				c.paused = &b
			} else {
				c.continuous = &b
			}
		case "interval":
			d, err := wantSeconds(m.val, at)
			if err != nil {
				return c, err
			}
			c.interval = &d
		case "then":
			s, err := wantString(m.val, at)
			if err != nil {
				return c, err
			}
			if s != "" {
				if msg := checkQueueName(s); msg != "" {
					return c, invalidField(at, "the queue name %s", msg)
				}
			}
			c.then = &s
		case "config":
			if m.val.kind != kindObject {
				return c, invalidField(at, "want an object, got %s", m.val.describe())
			}
			raw, err := paramsToBSON(m.val, at)
			if err != nil {
				return c, err
			}
			c.config = raw
		}
	}
	return c, nil
}

// bindBackoff reads a retry_backoff: base and max in seconds, jitter a
// fraction, each optional. A missing field takes schema.DefaultBackoff's
// value, except that a missing max is raised to a larger base and a
// missing base lowered to a smaller max. A max below the base given is a
// 409 (conflicting_fields): no schema can compare the two.
func bindBackoff(v value, at path) (schema.Backoff, *apiError) {
	o, err := asObject(v, at, schema.BackoffBase, schema.BackoffMax, schema.BackoffJitter)
	if err != nil {
		return schema.Backoff{}, err
	}
	b := schema.DefaultBackoff
	var hasBase, hasMax bool
	for _, m := range o.members {
		mat := at.key(m.key)
		switch m.key {
		case schema.BackoffBase:
			if b.Base, err = wantSeconds(m.val, mat); err != nil {
				return b, err
			}
			hasBase = true
		case schema.BackoffMax:
			if b.Max, err = wantSeconds(m.val, mat); err != nil {
				return b, err
			}
			hasMax = true
		case schema.BackoffJitter:
			f, err := wantNumber(m.val, mat, 0, 1)
			if err != nil {
				return b, err
			}
			b.Jitter = f
		}
	}
	switch {
	case hasBase && hasMax && b.Max < b.Base:
		return b, errorf(http.StatusConflict, CodeConflictingFields, at.key(schema.BackoffMax).String(),
			"the backoff's max (%v s) is below its base (%v s)", b.Max.Seconds(), b.Base.Seconds())
	case hasBase:
		b.Max = max(b.Max, b.Base)
	case hasMax:
		b.Base = min(b.Base, b.Max)
	}
	return b, nil
}

func (h *handler) queueList(w http.ResponseWriter, r *http.Request) error {
	res, err := h.st.QueueList(r.Context())
	if err != nil {
		return err
	}
	for _, m := range res.Malformed {
		h.log.Warn("skipping a queue document that cannot be read", "error", m)
	}
	running, err := h.st.TaskRunningCounts(r.Context())
	if err != nil {
		return err
	}
	out := struct {
		Queues  []Queue `json:"queues"`
		Skipped int     `json:"skipped"`
	}{Queues: make([]Queue, 0, len(res.Queues)), Skipped: len(res.Malformed)}
	for _, q := range res.Queues {
		out.Queues = append(out.Queues, queueView(q, running))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (h *handler) queueCreate(w http.ResponseWriter, r *http.Request) error {
	v, aerr := h.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	c, aerr := h.bindQueue(v)
	if aerr != nil {
		return aerr
	}
	switch {
	case c.name == nil:
		return errorf(http.StatusBadRequest, CodeMissingField, "name", "name is required")
	case c.plugin == nil:
		return errorf(http.StatusBadRequest, CodeMissingField, "plugin", "plugin is required: the plugin that runs the queue's tasks")
	}
	p := store.QueueCreateParams{Name: *c.name, Constructor: *c.plugin, MaxThreads: c.maxThreads, Sort: schema.SortDefault}
	if !c.setMaxThreads {
		one := 1 // a new queue runs, as with `disbatch queue create`
		p.MaxThreads = &one
	}
	if c.sort != nil {
		p.Sort = *c.sort
	}
	if err := h.checkThen(r, c); err != nil {
		return err
	}
	q, err := h.st.QueueCreate(r.Context(), p)
	if errors.Is(err, store.ErrQueueExists) {
		return errorf(http.StatusConflict, CodeConflict, "name", "a queue named %q already exists", clip(*c.name))
	}
	if err != nil {
		return err
	}
	if c.nodesPin != nil || c.nodesIgnore != nil || c.control() || c.sched() {
		rest := c
		rest.name, rest.plugin, rest.setMaxThreads, rest.maxThreads, rest.sort = nil, nil, false, nil, nil
		if q, err = h.st.QueueModify(r.Context(), rest.update(q.ID)); err != nil {
			return err
		}
	}
	w.Header().Set("Location", "/api/v1/queues/"+q.ID.Hex())
	return writeJSON(w, http.StatusCreated, queueView(q, nil))
}

// queueByRef finds the queue a path or query parameter names: an id (24
// hex digits) or a name.
func (h *handler) queueByRef(r *http.Request, ref, field string) (schema.Queue, error) {
	q, err := h.st.QueueGet(r.Context(), store.QueueGetParams{Ref: ref})
	if errors.Is(err, store.ErrNotFound) {
		return schema.Queue{}, errorf(http.StatusNotFound, CodeNotFound, field, "no queue with the id or name %q", clip(ref))
	}
	return q, err
}

func (h *handler) queueGet(w http.ResponseWriter, r *http.Request) error {
	q, err := h.queueByRef(r, r.PathValue("queue"), "queue")
	if err != nil {
		return err
	}
	running, err := h.st.TaskRunningCounts(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, queueView(q, running))
}

func (h *handler) queuePatch(w http.ResponseWriter, r *http.Request) error {
	v, aerr := h.readBody(w, r)
	if aerr != nil {
		return aerr
	}
	c, aerr := h.bindQueue(v)
	if aerr != nil {
		return aerr
	}
	if c.fieldsSet == 0 {
		return errorf(http.StatusBadRequest, CodeInvalidField, "", "nothing to change: give at least one of %s", strings.Join(queueFields, ", "))
	}
	q, err := h.queueByRef(r, r.PathValue("queue"), "queue")
	if err != nil {
		return err
	}
	if err := h.checkThen(r, c); err != nil {
		return err
	}
	q, err = h.st.QueueModify(r.Context(), c.update(q.ID))
	switch {
	case errors.Is(err, store.ErrQueueExists):
		return errorf(http.StatusConflict, CodeConflict, "name", "a queue named %q already exists", clip(*c.name))
	case errors.Is(err, store.ErrNotFound):
		return errorf(http.StatusNotFound, CodeNotFound, "queue", "the queue %q is gone", clip(r.PathValue("queue")))
	case err != nil:
		return err
	}
	running, err := h.st.TaskRunningCounts(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, queueView(q, running))
}

func (h *handler) queueDelete(w http.ResponseWriter, r *http.Request) error {
	force := false
	if s, ok, aerr := oneParam(r.URL.Query(), "force"); aerr != nil {
		return aerr
	} else if ok {
		switch s {
		case "true":
			force = true
		case "false":
		default:
			return errorf(http.StatusBadRequest, CodeInvalidParameter, "force", "want true or false, got %q", clip(s))
		}
	}
	q, err := h.st.QueueGet(r.Context(), store.QueueGetParams{Ref: r.PathValue("queue")})
	if errors.Is(err, store.ErrNotFound) {
		// By its id, with force, a queue that is gone still has its tasks
		// deleted, if a delete cut short left some (QueueDelete says
		// whether there were any).
		id, perr := bson.ObjectIDFromHex(r.PathValue("queue"))
		if !force || perr != nil {
			return errorf(http.StatusNotFound, CodeNotFound, "queue", "no queue with the id or name %q", clip(r.PathValue("queue")))
		}
		q, err = schema.Queue{ID: id, Name: id.Hex()}, nil
	}
	if err != nil {
		return err
	}
	res, err := h.st.QueueDelete(r.Context(), store.QueueDeleteParams{ID: q.ID, Force: force})
	switch {
	case errors.Is(err, store.ErrThenQueue):
		return errorf(http.StatusConflict, CodeConflict, "queue", "%s", clip(err.Error()))
	case errors.Is(err, store.ErrUnfinishedTasks):
		return errorf(http.StatusConflict, CodeUnfinishedTasks, "force", "the queue %q has unfinished tasks (status <= 0); delete it with force=true to delete them too", clip(q.Name))
	case errors.Is(err, store.ErrNotFound):
		return errorf(http.StatusNotFound, CodeNotFound, "queue", "the queue %q is gone", clip(r.PathValue("queue")))
	case err != nil:
		return err
	}
	return writeJSON(w, http.StatusOK, struct {
		ID           string `json:"id"`
		Name         string `json:"name"`
		TasksDeleted int64  `json:"tasks_deleted"`
		FilesDeleted int64  `json:"files_deleted"`
	}{q.ID.Hex(), q.Name, res.TasksDeleted, res.FilesDeleted})
}
