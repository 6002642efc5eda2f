package dci

import (
	"errors"
	"net/http"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/store"
)

// The routes of Disbatch::Web::Tasks, deprecated in 4.2, mounted with
// Options.LegacyTasks.

// legacyMaxLimit is the most tasks POST /tasks/search answers.
const legacyMaxLimit = 100

// POST /tasks/search
func (h *Handler) legacySearch(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	p := readParams(r)
	if p.bad != nil || p.body != nil {
		send(w, http.StatusBadRequest, obj{"error": "filter and options must be name/value objects"}, false)
		return
	}
	filter, okF := p.fields["filter"].(map[string]any)
	options, okO := p.fields["options"].(map[string]any)
	if p.fields["filter"] == nil {
		filter, okF = map[string]any{}, true
	}
	if p.fields["options"] == nil {
		options, okO = map[string]any{}, true
	}
	if !okF || !okO {
		send(w, http.StatusBadRequest, obj{"error": "filter and options must be name/value objects"}, false)
		return
	}
	limit := int64(legacyMaxLimit)
	if v, ok := options["limit"]; ok && v != nil {
		n, ok := intOption(v)
		if !ok || n < 0 {
			send(w, http.StatusBadRequest, obj{"error": "limit must be a number"}, false)
			return
		}
		if n > legacyMaxLimit {
			send(w, http.StatusBadRequest, obj{"error": "limit cannot exceed 100"}, false)
			return
		}
		if n > 0 {
			limit = n
		}
	}
	skip, _ := intOption(options["skip"])
	var sort, projection bson.D
	for _, o := range []struct {
		name string
		to   *bson.D
	}{{"sort", &sort}, {"projection", &projection}} {
		if v, ok := options[o.name].(map[string]any); ok {
			d, err := toBSON(v, 0)
			if err != nil {
				send(w, http.StatusBadRequest, obj{"error": "options." + o.name + " " + err.Error()}, false)
				return
			}
			*o.to = d.(bson.D)
		}
	}
	for _, v := range []any{filter, options["sort"], options["projection"]} {
		if k := serverCode(v); k != "" {
			send(w, http.StatusBadRequest, obj{"error": serverCodeRefused(k)}, false)
			return
		}
	}
	fd := bson.D{}
	for k, v := range filter {
		val, err := legacyFilterValue(k, v)
		if err != nil {
			send(w, http.StatusBadRequest, obj{"error": "Bad OID passed: Invalid 'oid' field: OIDs must be 12 bytes"}, false)
			return
		}
		fd = append(fd, bson.E{Key: k, Value: val})
	}
	pretty := truthy(p.fields["pretty"])
	if truthy(p.fields["count"]) {
		n, err := h.o.Store.TaskCount(r.Context(), fd, 0, 0)
		if err != nil {
			send(w, http.StatusBadRequest, obj{"error": driverErrText(err)}, pretty)
			return
		}
		send(w, http.StatusOK, obj{"count": n}, pretty)
		return
	}
	terse := true
	if v, ok := p.fields["terse"]; ok {
		terse = truthy(v)
	}
	docs, err := h.o.Store.TaskFind(r.Context(), store.TaskFindParams{Filter: fd, Projection: projection, Sort: sort, Skip: skip, Limit: limit})
	if err != nil {
		send(w, http.StatusBadRequest, obj{"error": driverErrText(err)}, pretty)
		return
	}
	out := make([]any, 0, len(docs))
	for _, d := range docs {
		o, err := h.taskJSON(r.Context(), d, dateEpoch, terse, !terse)
		if err != nil {
			send(w, http.StatusBadRequest, obj{"error": errText(err)}, pretty)
			return
		}
		out = append(out, o)
	}
	send(w, http.StatusOK, out, pretty)
}

// legacyFilterValue: queue as a string is an ObjectId, {"$oid"} anywhere
// is one, ctime/mtime numbers above 9999999999 are milliseconds.
func legacyFilterValue(key string, v any) (any, error) {
	switch x := v.(type) {
	case string:
		if key == "queue" {
			return bson.ObjectIDFromHex(x)
		}
	case map[string]any:
		if s, ok := x["$oid"]; ok && len(x) == 1 {
			str, _ := s.(string)
			id, err := bson.ObjectIDFromHex(str)
			if err != nil {
				return nil, errors.New(strconv.Quote(str))
			}
			return id, nil
		}
		d := bson.D{}
		for k, el := range x {
			val, err := legacyFilterValue(key, el)
			if err != nil {
				return nil, err
			}
			d = append(d, bson.E{Key: k, Value: val})
		}
		return d, nil
	case []any:
		a := bson.A{}
		for _, el := range x {
			val, err := legacyFilterValue(key, el)
			if err != nil {
				return nil, err
			}
			a = append(a, val)
		}
		return a, nil
	}
	if key == "ctime" || key == "mtime" {
		if n, ok := v.(interface{ Float64() (float64, error) }); ok {
			if f, err := n.Float64(); err == nil {
				if f > 9999999999 {
					f /= 1000
				}
				return bson.NewDateTimeFromTime(timeFromEpoch(f)), nil
			}
		}
	}
	return toBSON(v, 0)
}

// POST /tasks/:queue is POST /tasks with the queue given by the path, and
// POST /tasks/search (4.103 routes both through one pattern).
func (h *Handler) legacyCreate(w http.ResponseWriter, r *http.Request, m map[string]string) {
	if m["queue"] == "search" {
		h.legacySearch(w, r, m)
		return
	}
	h.postTasks(w, r, map[string]any{"queue": m["queue"]})
}

// POST /tasks/:queue/:collection is POST /tasks with the queue and the
// collection given by the path.
func (h *Handler) legacyCreateFromCollection(w http.ResponseWriter, r *http.Request, m map[string]string) {
	h.postTasks(w, r, map[string]any{"queue": m["queue"], "collection": m["collection"]})
}

// serverCodeRefused is the 400 text for an operator serverCode found.
func serverCodeRefused(op string) string {
	return op + " is not allowed: it runs code on the database server"
}

// serverCode finds an operator that runs JavaScript on the server in a
// legacy search filter (which is otherwise a MongoDB query, as in 4.103).
func serverCode(v any) string {
	switch x := v.(type) {
	case map[string]any:
		for k, el := range x {
			if k == "$where" || k == "$function" || k == "$accumulator" {
				return k
			}
			if found := serverCode(el); found != "" {
				return found
			}
		}
	case []any:
		for _, el := range x {
			if found := serverCode(el); found != "" {
				return found
			}
		}
	}
	return ""
}
