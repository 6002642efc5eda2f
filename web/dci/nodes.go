package dci

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// GET /info
func (h *Handler) info(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	routes := obj{}
	for _, rt := range h.routes {
		a, _ := routes[rt.method].([]any)
		routes[rt.method] = append(a, rt.pattern)
	}
	ext := []any{}
	if h.o.LegacyTasks {
		ext = append(ext, LegacyTasksExtension)
	}
	send(w, http.StatusOK, obj{"database": h.o.Database, "web_extensions": ext, "routes": routes}, false)
}

// nodeJSON is a node document as 4.103 answers it: as stored, with "id"
// the hex of _id and timestamp in integer milliseconds.
func nodeJSON(raw bson.Raw) obj {
	o := docToObj(raw, dateISO)
	if id, ok := raw.Lookup("_id").ObjectIDOK(); ok {
		o["id"] = id.Hex()
	}
	if ts, ok := raw.Lookup(schema.NodeTimestamp).TimeOK(); ok {
		o[schema.NodeTimestamp] = ts.UnixMilli()
	}
	return o
}

// GET /nodes
func (h *Handler) nodes(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	docs, err := h.o.Store.NodeDocs(r.Context())
	if err != nil {
		h.dbError(r, "list nodes", err)
		send(w, http.StatusBadRequest, obj{"error": "Could not get current nodes: " + errText(err)}, false)
		return
	}
	out := make([]any, len(docs))
	for i, d := range docs {
		out[i] = nodeJSON(d)
	}
	send(w, http.StatusOK, out, false)
}

// GET /nodes/:node
func (h *Handler) node(w http.ResponseWriter, r *http.Request, m map[string]string) {
	doc, err := h.o.Store.NodeDoc(r.Context(), m["node"])
	switch {
	case errors.Is(err, store.ErrNotFound):
		send(w, http.StatusOK, nil, false)
	case err != nil:
		h.dbError(r, "read node", err)
		send(w, http.StatusBadRequest, obj{"error": fmt.Sprintf("Could not get node %s: %s", m["node"], errText(err))}, false)
	default:
		send(w, http.StatusOK, nodeJSON(doc), false)
	}
}

var digits = regexp.MustCompile(`^\d+$`)

// POST /nodes/:node
func (h *Handler) nodeSet(w http.ResponseWriter, r *http.Request, m map[string]string) {
	p := readParams(r)
	if p.bad != nil && p.bad != errBody {
		send(w, http.StatusBadRequest, obj{"error": "Could not read the request: " + p.bad.Error()}, false)
		return
	}
	if len(p.fields) == 0 || p.body != nil || p.bad != nil {
		send(w, http.StatusBadRequest, obj{"error": "No params"}, false)
		return
	}
	for _, k := range p.keys {
		if k != schema.NodeMaxThreads {
			send(w, http.StatusBadRequest, obj{"error": "Invalid param", "param": k}, false)
			return
		}
	}
	var maxThreads *int
	if v := p.fields[schema.NodeMaxThreads]; v != nil {
		s, ok := scalar(v)
		n, err := strconv.Atoi(s)
		if !ok || !digits.MatchString(s) || err != nil || n > schema.MaxThreadsLimit {
			send(w, http.StatusBadRequest, obj{"error": "maxthreads must be a non-negative integer or null"}, false)
			return
		}
		maxThreads = &n
	}
	res, err := h.o.Store.NodeMaxThreadsSet(r.Context(), store.NodeMaxThreadsSetParams{Ref: m["node"], MaxThreads: maxThreads})
	if err != nil {
		h.dbError(r, "set node maxthreads", err)
		send(w, http.StatusBadRequest, obj{driverError: obj{"message": errText(err)}, "error": errText(err)}, false)
		return
	}
	result := updateResult(res)
	if res.Matched != 1 {
		send(w, http.StatusBadRequest, obj{updateResultKey: result, "error": result}, false)
		return
	}
	send(w, http.StatusOK, obj{updateResultKey: result}, false)
}

// GET /plugins
func (h *Handler) plugins(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	send(w, http.StatusOK, stringsJSON(h.o.Plugins), false)
}

func stringsJSON(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// The Perl driver's result objects, keyed by their class names.
const (
	insertOneResultKey  = "MongoDB::InsertOneResult"
	insertManyResultKey = "MongoDB::InsertManyResult"
	updateResultKey     = "MongoDB::UpdateResult"
	deleteResultKey     = "MongoDB::DeleteResult"
	duplicateKeyKey     = "MongoDB::DuplicateKeyError"
	driverError         = "MongoDB::Error"
)

func updateResult(c store.WriteCounts) obj {
	return obj{"matched_count": c.Matched, "modified_count": c.Modified, "upserted_id": nil,
		"write_errors": []any{}, "write_concern_errors": []any{}}
}

func deleteResult(c store.WriteCounts) obj {
	return obj{"deleted_count": c.Deleted, "write_errors": []any{}, "write_concern_errors": []any{}}
}
