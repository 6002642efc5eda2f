package live

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/store"
)

// filter is what one subscriber asked for. Different parameters combine
// with AND, the values of one parameter with OR.
type filter struct {
	kinds  kind
	queues map[bson.ObjectID]bool // nil: every queue
	tasks  map[bson.ObjectID]bool // nil: every task
}

// match reports whether the subscriber wants it.
func (f *filter) match(it *item) bool {
	if it.kind == kindControl {
		return true
	}
	if f.kinds&it.kind == 0 {
		return false
	}
	switch it.kind {
	case kindTask:
		if f.tasks != nil && !(it.hasTask && f.tasks[it.task]) {
			return false
		}
		// A task event whose queue is unknown (another program's update
		// before the hub asks for pre-images) goes to every queue's
		// subscribers: which one it concerns cannot be told, and dropped,
		// a queue's page never heard of its task's change.
		known := it.hasQueue || it.hasFrom
		if f.queues != nil && known && !(it.hasQueue && f.queues[it.queue]) && !(it.hasFrom && f.queues[it.from]) {
			return false
		}
	case kindQueue:
		if f.queues != nil && !(it.hasQueue && f.queues[it.queue]) {
			return false
		}
	}
	return true
}

// all reports whether the filter lets every change event through.
func (f *filter) all() bool { return f.kinds == kindsAll && f.queues == nil && f.tasks == nil }

// request is a parsed subscription.
type request struct {
	filter filter
	from   bson.Raw // resume just after this position; nil: now
	fromID string
}

// values returns the values of a repeatable parameter, each also split on
// commas, trimmed, empty ones dropped.
func values(r *http.Request, name string) []string {
	var out []string
	for _, v := range r.URL.Query()[name] {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// parse reads the query parameters and Last-Event-ID. Queue names are
// resolved with the Lookup when there is one.
func (h *Hub) parse(ctx context.Context, r *http.Request) (request, *Error) {
	var req request
	req.filter.kinds = kindsAll
	q := r.URL.Query()
	if _, ok := q["types"]; ok {
		req.filter.kinds = 0
		for _, t := range values(r, "types") {
			switch t {
			case "task":
				req.filter.kinds |= kindTask
			case "queue":
				req.filter.kinds |= kindQueue
			case "node":
				req.filter.kinds |= kindNode
			default:
				return req, badParam("types", fmt.Sprintf("unknown event type %q: want a comma-separated list of task, queue and node", t))
			}
		}
		if req.filter.kinds == 0 {
			return req, badParam("types", "empty: want a comma-separated list of task, queue and node")
		}
	}
	for _, v := range values(r, "task") {
		id, err := bson.ObjectIDFromHex(v)
		if err != nil {
			return req, badParam("task", fmt.Sprintf("%q is not a task id (an ObjectId: 24 hex digits)", v))
		}
		if req.filter.tasks == nil {
			req.filter.tasks = map[bson.ObjectID]bool{}
		}
		req.filter.tasks[id] = true
	}
	for _, v := range q["queue"] {
		ids, err := h.queueIDs(ctx, v)
		if err != nil {
			return req, err
		}
		for _, id := range ids {
			if req.filter.queues == nil {
				req.filter.queues = map[bson.ObjectID]bool{}
			}
			req.filter.queues[id] = true
		}
	}
	// Without types=, a filter names what the subscriber is interested in:
	// task= asks for task events, queue= for task and queue events.
	if _, ok := q["types"]; !ok {
		switch {
		case req.filter.tasks != nil:
			req.filter.kinds = kindTask
		case req.filter.queues != nil:
			req.filter.kinds = kindTask | kindQueue
		}
	}
	// The header wins: a browser reconnecting sends it with the URL it
	// first used, ?last_event_id= included.
	field, last := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if last == "" {
		field, last = "last_event_id", q.Get("last_event_id")
	}
	if last = strings.TrimSpace(last); last != "" {
		tok, err := decodeID(last)
		if err != nil {
			return req, badParam(field, err.Error())
		}
		req.from, req.fromID = tok, last
	}
	return req, nil
}

// queueID resolves a queue parameter: an id (24 hex digits, taken as
// is: a queue created later or deleted is still its id), or a name.
// queueIDs resolves one value of queue=: a queue's id or name, or a
// comma-separated list of them. A name may hold commas (queue names are
// free text): a value that is one queue's whole name is that queue, and
// only otherwise a list.
func (h *Hub) queueIDs(ctx context.Context, v string) ([]bson.ObjectID, *Error) {
	whole := strings.TrimSpace(v)
	if strings.Contains(whole, ",") && h.opts.Lookup != nil {
		q, err := h.opts.Lookup.QueueGet(ctx, store.QueueGetParams{Ref: whole})
		switch {
		case err == nil:
			return []bson.ObjectID{q.ID}, nil
		case !errors.Is(err, store.ErrNotFound):
			h.log.Warn("look up queue", "queue", whole, "error", err)
			return nil, &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Field: "queue",
				Message: fmt.Sprintf("could not look up queue %q; try again", whole)}
		}
	}
	var ids []bson.ObjectID
	for _, ref := range strings.Split(whole, ",") {
		if ref = strings.TrimSpace(ref); ref == "" {
			continue
		}
		id, err := h.queueID(ctx, ref)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (h *Hub) queueID(ctx context.Context, ref string) (bson.ObjectID, *Error) {
	if id, err := bson.ObjectIDFromHex(ref); err == nil {
		return id, nil
	}
	if h.opts.Lookup == nil {
		return bson.ObjectID{}, badParam("queue", fmt.Sprintf("%q is not a queue id (an ObjectId: 24 hex digits)", ref))
	}
	q, err := h.opts.Lookup.QueueGet(ctx, store.QueueGetParams{Ref: ref})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return bson.ObjectID{}, badParam("queue", fmt.Sprintf("no queue is named %q", ref))
	case err != nil:
		h.log.Warn("look up queue", "queue", ref, "error", err)
		return bson.ObjectID{}, &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Field: "queue",
			Message: fmt.Sprintf("could not look up queue %q; try again", ref)}
	}
	return q.ID, nil
}
