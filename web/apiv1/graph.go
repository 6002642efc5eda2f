package apiv1

import (
	"errors"
	"net/http"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// Task graphs (seed 002) in POST /api/v1/tasks: a task may carry ref (its
// name within the request), queue (a name or id, over the body's queue),
// parents (refs of the request or ids of stored tasks) and
// on_parent_failure; a request with any of them is inserted whole by
// store.TaskInsertGraph. GET /api/v1/tasks/{id}/graph shows a task's
// ancestors and descendants.

// graphFields are the graph fields of a task in POST /api/v1/tasks.
var graphFields = []string{"ref", "queue", "parents", "on_parent_failure"}

// graphBinding is what a task of a submit says about its graph.
type graphBinding struct {
	ref, queue      string
	parents         []string
	parentsAt       path
	onParentFailure string
	set             bool // any graph field given
}

// bindGraph reads a task's graph fields.
func bindGraph(o object) (graphBinding, *apiError) {
	var g graphBinding
	if v, at, ok := o.get("ref"); ok {
		s, aerr := wantString(v, at)
		if aerr != nil {
			return g, aerr
		}
		if s == "" || len(s) > maxNameLength {
			return g, invalidField(at, "want a name of 1 to %d characters", maxNameLength)
		}
		if objectIDPattern.MatchString(s) {
			return g, invalidField(at, "%q looks like a task id; a ref must not (parents would be ambiguous)", s)
		}
		g.ref, g.set = s, true
	}
	if v, at, ok := o.get("queue"); ok {
		s, aerr := wantString(v, at)
		if aerr != nil {
			return g, aerr
		}
		if s == "" {
			return g, invalidField(at, "want a queue's id or name, got an empty string")
		}
		g.queue, g.set = s, true
	}
	if v, at, ok := o.get("parents"); ok {
		ps, aerr := wantStrings(v, at, schema.MaxParents, func(s string) string {
			if s == "" {
				return "want a ref of this request or a task's id, got an empty string"
			}
			return ""
		})
		if aerr != nil {
			return g, aerr
		}
		g.parents, g.parentsAt, g.set = ps, at, true
	}
	if v, at, ok := o.get("on_parent_failure"); ok {
		s, aerr := wantString(v, at)
		if aerr != nil {
			return g, aerr
		}
		if s != schema.OnParentFailureFail && s != schema.OnParentFailureRun {
			return g, invalidField(at, "want %q or %q, got %q", schema.OnParentFailureFail, schema.OnParentFailureRun, clip(s))
		}
		g.onParentFailure, g.set = s, true
	}
	return g, nil
}

// submitGraph inserts a submit with graph fields: refs resolved to ids
// chosen here, queues looked up, then one store.TaskInsertGraph, which
// checks the graph and inserts all or nothing.
func (h *handler) submitGraph(w http.ResponseWriter, r *http.Request, queue schema.Queue, tasksAt path, params []bson.Raw, controls []store.TaskInsertControl, graphs []graphBinding) error {
	ids := make([]bson.ObjectID, len(params))
	refs := map[string]int{}
	for i, g := range graphs {
		ids[i] = bson.NewObjectID()
		if g.ref == "" {
			continue
		}
		if j, dup := refs[g.ref]; dup {
			return errorf(http.StatusConflict, CodeConflictingFields, tasksAt.index(i).key("ref").String(), "ref %q is also tasks[%d]'s", clip(g.ref), j)
		}
		refs[g.ref] = i
	}
	queues := map[string]bson.ObjectID{}
	tasks := make([]store.GraphTask, len(params))
	for i, g := range graphs {
		q := queue.ID
		if g.queue != "" {
			var ok bool
			if q, ok = queues[g.queue]; !ok {
				qq, err := h.queueByRef(r, g.queue, tasksAt.index(i).key("queue").String())
				if err != nil {
					return err
				}
				q = qq.ID
				queues[g.queue] = q
			}
		}
		t := store.GraphTask{ID: ids[i], Queue: q, Parameters: params[i], OnParentFailure: g.onParentFailure, Ref: g.ref}
		if controls[i] != (store.TaskInsertControl{}) {
			c := controls[i]
			t.Control = &c
		}
		for k, ref := range g.parents {
			at := g.parentsAt.index(k).String()
			if j, ok := refs[ref]; ok {
				t.Parents = append(t.Parents, ids[j]) // itself: the store refuses it (409)
				continue
			}
			if !objectIDPattern.MatchString(ref) {
				return errorf(http.StatusNotFound, CodeNotFound, at, "%q is neither a ref of this request nor a task's id", clip(ref))
			}
			id, _ := bson.ObjectIDFromHex(ref)
			t.Parents = append(t.Parents, id)
		}
		tasks[i] = t
	}
	var err error
	gp := store.TaskInsertGraphParams{Tasks: tasks}
	gp.TraceParent, gp.TraceState = tracing.FromHeader(r.Header)
	ids, err = h.st.TaskInsertGraph(r.Context(), gp)
	var ge *store.GraphInputError
	if errors.As(err, &ge) {
		field := tasksAt.index(ge.Task).String()
		switch ge.Kind {
		case store.GraphUnknown:
			return errorf(http.StatusNotFound, CodeNotFound, field+".parents", "%s", ge.Msg)
		case store.GraphConflict:
			return errorf(http.StatusConflict, CodeConflictingFields, field+".parents", "%s", ge.Msg)
		}
		return errorf(http.StatusBadRequest, CodeInvalidField, field, "%s", ge.Msg)
	}
	if err != nil {
		return err
	}
	out := struct {
		Queue string            `json:"queue"`
		IDs   []string          `json:"ids"`
		Refs  map[string]string `json:"refs"`
	}{Queue: queue.ID.Hex(), IDs: make([]string, len(ids)), Refs: map[string]string{}}
	for i, id := range ids {
		out.IDs[i] = id.Hex()
		if graphs[i].ref != "" {
			out.Refs[graphs[i].ref] = id.Hex()
		}
	}
	return writeJSON(w, http.StatusCreated, out)
}

// graphNodeView is a task of GET /api/v1/tasks/{id}/graph.
type graphNodeView struct {
	ID              string   `json:"id"`
	Depth           int      `json:"depth"`
	Queue           string   `json:"queue"`
	Status          int      `json:"status"`
	StatusName      *string  `json:"status_name"`
	Reason          *string  `json:"reason"`
	Parents         []string `json:"parents"`
	OnParentFailure string   `json:"on_parent_failure"`
	AwaitingParents bool     `json:"awaiting_parents"`
}

func (h *handler) taskGraph(w http.ResponseWriter, r *http.Request) error {
	id, aerr := objectID(r.PathValue("id"), "id")
	if aerr != nil {
		return aerr
	}
	view, err := h.st.TaskGraphGet(r.Context(), store.TaskGraphGetParams{ID: id, Limit: store.MaxGraphView})
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusNotFound, CodeNotFound, "id", "no task %s", id.Hex())
	}
	if err != nil {
		return err
	}
	out := struct {
		ID        string          `json:"id"`
		Tasks     []graphNodeView `json:"tasks"`
		Truncated bool            `json:"truncated"`
	}{ID: id.Hex(), Tasks: make([]graphNodeView, len(view.Nodes)), Truncated: view.Truncated}
	for i, n := range view.Nodes {
		v := graphNodeView{ID: n.ID.Hex(), Depth: n.Depth, Queue: n.Queue.Hex(), Status: int(n.Status),
			Parents: make([]string, len(n.Parents)), OnParentFailure: n.OnParentFailure, AwaitingParents: n.AwaitingParents}
		if v.OnParentFailure == "" {
			v.OnParentFailure = schema.OnParentFailureFail
		}
		if _, named := statusNames[n.Status]; named {
			name := n.Status.String()
			v.StatusName = &name
		}
		if n.Reason != "" {
			reason := n.Reason
			v.Reason = &reason
		}
		for k, p := range n.Parents {
			v.Parents[k] = p.Hex()
		}
		out.Tasks[i] = v
	}
	return writeJSON(w, http.StatusOK, out)
}
