package dci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// queueReport is GET /queues: one object per queue in natural order, its
// counts from the projected counters (count_todo: status <= 0, count_total)
// and the running tasks (-1 and 0, on any node) counted in one aggregation:
// queued = count_todo - running, completed = count_total - count_todo. A
// queue whose counters are not there yet (no node has projected it), or
// are not integers (schema.Counter: a value another program wrote, until
// the projector's recount), is counted the 4.103 way.
func (h *Handler) queueReport(ctx context.Context) ([]obj, error) {
	// The two reads are independent: one round trip's time, not two.
	var running map[bson.ObjectID]int64
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		running, runErr = h.o.Store.TaskRunningCounts(ctx)
	}()
	docs, err := h.o.Store.QueueDocs(ctx)
	<-done
	if err != nil {
		return nil, err
	}
	if runErr != nil {
		return nil, runErr
	}
	out := make([]obj, 0, len(docs))
	for _, d := range docs {
		id, ok := d.Lookup("_id").ObjectIDOK()
		if !ok {
			continue
		}
		o := obj{
			"id":      id.Hex(),
			"name":    fieldOr(d, schema.QueueName),
			"plugin":  fieldOr(d, schema.QueuePlugin, schema.QueueConstructor),
			"threads": fieldOr(d, schema.QueueThreads, schema.QueueMaxThreads),
		}
		todo, okTodo := schema.Count(d.Lookup(schema.QueueCountTodo))
		total, okTotal := schema.Count(d.Lookup(schema.QueueCountTotal))
		if okTodo && okTotal {
			run := running[id]
			o["running"] = run
			o["queued"] = max(todo-run, 0)
			o["completed"] = max(total-todo, 0)
		} else {
			q, run, c, err := h.o.Store.QueueStatusCounts(ctx, id)
			if err != nil {
				return nil, err
			}
			o["queued"], o["running"], o["completed"] = q, run, c
		}
		out = append(out, o)
	}
	return out, nil
}

// fieldOr returns the first of the fields present and not null, as JSON.
func fieldOr(d bson.Raw, keys ...string) any {
	for _, k := range keys {
		if v, err := d.LookupErr(k); err == nil && v.Type != bson.TypeNull {
			return fromBSON(v, dateISO)
		}
	}
	return nil
}

// GET /queues
func (h *Handler) queues(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	rep, err := h.queueReport(r.Context())
	if err != nil {
		h.dbError(r, "queue report", err)
		send(w, http.StatusBadRequest, obj{"error": "Could not get current queues: " + errText(err)}, false)
		return
	}
	out := make([]any, len(rep))
	for i, o := range rep {
		out[i] = o
	}
	send(w, http.StatusOK, out, false)
}

// GET /queues/:queue
func (h *Handler) queue(w http.ResponseWriter, r *http.Request, m map[string]string) {
	rep, err := h.queueReport(r.Context())
	if err != nil {
		h.dbError(r, "queue report", err)
		send(w, http.StatusBadRequest, obj{"error": "Could not get current queues: " + errText(err)}, false)
		return
	}
	key := "name"
	if isOID(m["queue"]) {
		key = "id"
	}
	for _, o := range rep {
		if o[key] == m["queue"] {
			send(w, http.StatusOK, o, false)
			return
		}
	}
	send(w, http.StatusOK, nil, false)
}

func isOID(s string) bool {
	_, err := bson.ObjectIDFromHex(s)
	return err == nil && len(s) == 24
}

// POST /queues
func (h *Handler) queueCreate(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	p := readParams(r)
	if p.bad != nil && p.bad != errBody {
		send(w, http.StatusBadRequest, obj{"error": "Could not read the request: " + p.bad.Error()}, false)
		return
	}
	name, okName := scalar(p.fields["name"])
	plugin, okPlugin := scalar(p.fields["plugin"])
	if !okName || !okPlugin || name == "" || plugin == "" {
		send(w, http.StatusBadRequest, obj{"error": "name and plugin required"}, false)
		return
	}
	for _, k := range p.keys {
		if k != "name" && k != "plugin" {
			send(w, http.StatusBadRequest, obj{"error": "Invalid param", "param": k}, false)
			return
		}
	}
	if !slices.Contains(h.o.Plugins, plugin) {
		send(w, http.StatusBadRequest, obj{"error": "Unknown plugin", "plugin": plugin}, false)
		return
	}
	q, err := h.o.Store.QueueCreate(r.Context(), store.QueueCreateParams{Name: name, Constructor: plugin})
	if errors.Is(err, store.ErrQueueExists) {
		msg := h.duplicateName(name)
		result := obj{insertOneResultKey: obj{"inserted_id": oid(bson.NewObjectID()), "write_concern_errors": []any{}, "write_errors": []any{obj{
			"code": 11000, "errmsg": msg, "index": 0, "keyPattern": obj{"name": 1}, "keyValue": obj{"name": name},
			"op": obj{"name": name, "plugin": plugin}}}}}
		send(w, http.StatusBadRequest, obj{duplicateKeyKey: duplicateKeyError(msg, result), "id": nil, "error": duplicateKeyKey + ": " + msg}, false)
		return
	}
	if err != nil {
		h.dbError(r, "create queue", err)
		send(w, http.StatusBadRequest, obj{driverError: obj{"message": errText(err)}, "id": nil, "error": errText(err)}, false)
		return
	}
	res := obj{"inserted_id": oid(q.ID), "write_errors": []any{}, "write_concern_errors": []any{}}
	send(w, http.StatusOK, obj{insertOneResultKey: res, "id": oid(q.ID)}, false)
}

// POST /queues/:queue
func (h *Handler) queueSet(w http.ResponseWriter, r *http.Request, m map[string]string) {
	p := readParams(r)
	if p.bad != nil && p.bad != errBody {
		send(w, http.StatusBadRequest, obj{"error": "Could not read the request: " + p.bad.Error()}, false)
		return
	}
	if len(p.fields) == 0 {
		send(w, http.StatusBadRequest, obj{"error": "no params"}, false)
		return
	}
	for _, k := range p.keys {
		if k != "name" && k != "plugin" && k != "threads" {
			send(w, http.StatusBadRequest, obj{"error": "unknown param", "param": k}, false)
			return
		}
	}
	sp := store.QueueSetParams{Ref: m["queue"]}
	if v, ok := p.fields["plugin"]; ok {
		s, isScalar := scalar(v)
		if !isScalar || !slices.Contains(h.o.Plugins, s) {
			send(w, http.StatusBadRequest, obj{"error": "unknown plugin", "plugin": pluginJSON(v)}, false)
			return
		}
		sp.Plugin = &s
	}
	if v, ok := p.fields["threads"]; ok {
		s, isScalar := scalar(v)
		n, err := strconv.Atoi(s)
		if !isScalar || !digits.MatchString(s) || err != nil || n > schema.MaxThreadsLimit {
			send(w, http.StatusBadRequest, obj{"error": "threads must be a non-negative integer"}, false)
			return
		}
		sp.Threads = &n
	}
	if v, ok := p.fields["name"]; ok {
		s, isScalar := v.(string)
		if !isScalar || s == "" {
			send(w, http.StatusBadRequest, obj{"error": "name must be a string"}, false)
			return
		}
		if err := store.ValidateQueueName(s); err != nil {
			send(w, http.StatusBadRequest, obj{"error": err.Error()}, false)
			return
		}
		sp.Name = &s
	}
	res, err := h.o.Store.QueueSet(r.Context(), sp)
	if errors.Is(err, store.ErrQueueExists) {
		msg := h.duplicateName(*sp.Name)
		send(w, http.StatusBadRequest, obj{duplicateKeyKey: duplicateKeyError(msg, nil), "error": duplicateKeyKey + ": " + msg}, false)
		return
	}
	if err != nil {
		h.dbError(r, "update queue", err)
		send(w, http.StatusBadRequest, obj{driverError: obj{"message": errText(err)}, "error": errText(err)}, false)
		return
	}
	result := updateResult(res)
	if res.Matched != 1 {
		send(w, http.StatusBadRequest, obj{updateResultKey: result, "error": "no queue " + m["queue"]}, false)
		return
	}
	send(w, http.StatusOK, obj{updateResultKey: result}, false)
}

// duplicateName is MongoDB's message for a queue name taken.
func (h *Handler) duplicateName(name string) string {
	return fmt.Sprintf(`E11000 duplicate key error collection: %s.queues index: name_1 dup key: { name: %s }`, h.o.Database, strconv.Quote(name))
}

// duplicateKeyError is the Perl driver's exception object as JSON.
func duplicateKeyError(msg string, result any) obj {
	return obj{"code": 11000, "error_labels": []any{}, "message": msg, "previous_exception": "", "result": result}
}

func pluginJSON(v any) any {
	if s, ok := scalar(v); ok {
		return s
	}
	return nil
}

// DELETE /queues/:queue deletes the queue document only (4.103): its
// tasks stay, for the record.
func (h *Handler) queueDelete(w http.ResponseWriter, r *http.Request, m map[string]string) {
	res, err := h.o.Store.QueueDocDelete(r.Context(), m["queue"])
	if err != nil {
		h.dbError(r, "delete queue", err)
		send(w, http.StatusBadRequest, obj{driverError: obj{"message": errText(err)}, "error": errText(err)}, false)
		return
	}
	result := deleteResult(res)
	if res.Deleted != 1 {
		send(w, http.StatusBadRequest, obj{deleteResultKey: result, "error": "no queue " + m["queue"]}, false)
		return
	}
	send(w, http.StatusOK, obj{deleteResultKey: result}, false)
}
