package apiv1

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// queueFields are the writable fields of a queue, in the order of the
// document.
var queueFields = []string{"name", "plugin", "maxthreads", "sort", "nodes_pin", "nodes_ignore"}

// maxNodeList bounds nodes_pin and nodes_ignore.
const maxNodeList = 1000

// queueChange is a bound queue body: nil leaves a field alone.
type queueChange struct {
	name, plugin          *string
	setMaxThreads         bool
	maxThreads            *int
	sort                  *schema.Sort
	nodesPin, nodesIgnore *[]string
	fieldsSet             int
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
				return c, invalidField(at, "want fifo, lifo or default, got %q", clip(s))
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
		}
	}
	return c, nil
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
	q, err := h.st.QueueCreate(r.Context(), p)
	if errors.Is(err, store.ErrQueueExists) {
		return errorf(http.StatusConflict, CodeConflict, "name", "a queue named %q already exists", clip(*c.name))
	}
	if err != nil {
		return err
	}
	if c.nodesPin != nil || c.nodesIgnore != nil {
		if q, err = h.st.QueueModify(r.Context(), store.QueueUpdateParams{ID: q.ID, NodesPin: c.nodesPin, NodesIgnore: c.nodesIgnore}); err != nil {
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
	q, err = h.st.QueueModify(r.Context(), store.QueueUpdateParams{ID: q.ID, Name: c.name, Constructor: c.plugin,
		SetMaxThreads: c.setMaxThreads, MaxThreads: c.maxThreads, Sort: c.sort, NodesPin: c.nodesPin, NodesIgnore: c.nodesIgnore})
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
	q, err := h.queueByRef(r, r.PathValue("queue"), "queue")
	if err != nil {
		return err
	}
	res, err := h.st.QueueDelete(r.Context(), store.QueueDeleteParams{ID: q.ID, Force: force})
	switch {
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
