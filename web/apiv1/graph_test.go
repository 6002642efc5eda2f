package apiv1

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

type graphSubmitted struct {
	Queue string            `json:"queue"`
	IDs   []string          `json:"ids"`
	Refs  map[string]string `json:"refs"`
}

func (e *env) rawTask(id string) bson.Raw {
	e.t.Helper()
	raw, err := e.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "_id", Value: oid(e.t, id)}}).Raw()
	require.NoError(e.t, err)
	return raw
}

// TestTaskSubmitGraph: refs resolve to the ids of the tasks of the
// request, a task's queue overrides the body's, a stored task is a parent
// too; children wait (-4) for their parents and the answer maps refs to ids.
func TestTaskSubmitGraph(t *testing.T) {
	e := setup(t)
	qa, qb := e.newQueue("a"), e.newQueue("b")
	stored := e.submit("a", `{}`)[0]
	var s graphSubmitted
	e.want(201, "POST", "/api/v1/tasks", `{"queue":"a","tasks":[
		{"ref":"fetch","params":{"u":1}},
		{"ref":"build","queue":"b","params":{},"parents":["fetch","`+stored+`"],"on_parent_failure":"run"},
		{"params":{},"parents":["build"]}]}`).decode(t, &s)
	require.Len(t, s.IDs, 3)
	require.Equal(t, map[string]string{"fetch": s.IDs[0], "build": s.IDs[1]}, s.Refs)
	fetch, build, last := e.rawTask(s.IDs[0]), e.rawTask(s.IDs[1]), e.rawTask(s.IDs[2])
	require.Equal(t, int32(-2), fetch.Lookup("status").Int32())
	require.Equal(t, qa, fetch.Lookup("queue").ObjectID())
	require.Equal(t, int32(-4), build.Lookup("status").Int32())
	require.Equal(t, qb, build.Lookup("queue").ObjectID())
	require.Equal(t, "run", build.Lookup("on_parent_failure").StringValue())
	ps, _ := build.Lookup("parents").Array().Values()
	require.Equal(t, []string{s.IDs[0], stored}, []string{ps[0].ObjectID().Hex(), ps[1].ObjectID().Hex()})
	require.Equal(t, int32(-4), last.Lookup("status").Int32())
	require.True(t, last.Lookup("awaiting_parents").Boolean())

	// The task view shows the graph fields (and the schema check of
	// e.want holds them to the OpenAPI document).
	bv := e.task(s.IDs[1])
	require.Equal(t, []string{s.IDs[0], stored}, bv.Parents)
	require.Equal(t, "run", *bv.OnParentFailure)
	require.True(t, *bv.AwaitingParents)
	fv := e.task(s.IDs[0])
	require.Nil(t, fv.Parents)
	require.Nil(t, fv.OnParentFailure)
	require.Nil(t, fv.AwaitingParents)
}

// TestTaskSubmitGraphRefusesBadGraphs: each bad graph is refused with the
// status, code and field that say why, and nothing is inserted.
func TestTaskSubmitGraphRefusesBadGraphs(t *testing.T) {
	e := setup(t)
	e.newQueue("a")
	ghost := bson.NewObjectID().Hex()
	many := make([]string, 1001)
	for i := range many {
		many[i] = `"` + bson.NewObjectID().Hex() + `"`
	}
	for _, tc := range []struct {
		name        string
		tasks       string
		status      int
		code, field string
		messagePart string
	}{
		{"unknown ref", `{"ref":"x","params":{}},{"params":{},"parents":["y"]}`, 404, CodeNotFound, "tasks[1].parents[0]", "neither a ref"},
		{"self", `{"ref":"x","params":{},"parents":["x"]}`, 409, CodeConflictingFields, "tasks[0].parents", "its own parent"},
		{"duplicate ref", `{"ref":"x","params":{}},{"ref":"x","params":{}}`, 409, CodeConflictingFields, "tasks[1].ref", "also tasks[0]'s"},
		{"cycle", `{"ref":"x","params":{},"parents":["z"]},{"ref":"y","params":{},"parents":["x"]},{"ref":"z","params":{},"parents":["y"]}`, 409, CodeConflictingFields, "tasks[0].parents", "a cycle of parents"},
		{"unknown parent", `{"params":{},"parents":["` + ghost + `"]}`, 404, CodeNotFound, "tasks[0].parents", "no such task"},
		{"unknown queue", `{"params":{},"queue":"nope"}`, 404, CodeNotFound, "tasks[0].queue", "no queue"},
		{"too many parents", `{"params":{},"parents":[` + strings.Join(many, ",") + `]}`, 400, CodeInvalidField, "tasks[0].parents", "at most 1000"},
		{"on_parent_failure", `{"params":{},"on_parent_failure":"maybe"}`, 400, CodeInvalidField, "tasks[0].on_parent_failure", "want"},
		{"ref shaped like an id", `{"params":{},"ref":"` + ghost + `"}`, 400, CodeInvalidField, "tasks[0].ref", "looks like a task id"},
	} {
		d := e.wantErr(tc.status, tc.code, tc.field, "POST", "/api/v1/tasks", `{"queue":"a","tasks":[`+tc.tasks+`]}`)
		require.Contains(t, d.Message, tc.messagePart, tc.name)
		n, err := e.db.Collection("tasks").CountDocuments(context.Background(), bson.D{})
		require.NoError(t, err)
		require.Zero(t, n, "%s: nothing inserted", tc.name)
	}
}

// TestTaskGraphRoute: ancestors, the task and descendants with depths and
// states; 404 for an unknown task, 400 for a malformed id.
func TestTaskGraphRoute(t *testing.T) {
	e := setup(t)
	e.newQueue("a")
	var s graphSubmitted
	e.want(201, "POST", "/api/v1/tasks", `{"queue":"a","tasks":[
		{"ref":"root","params":{}},
		{"ref":"mid","params":{},"parents":["root"]},
		{"ref":"leaf","params":{},"parents":["mid"],"on_parent_failure":"run"},
		{"ref":"other","params":{}}]}`).decode(t, &s)
	var g struct {
		ID    string `json:"id"`
		Tasks []struct {
			ID              string   `json:"id"`
			Depth           int      `json:"depth"`
			Status          int      `json:"status"`
			StatusName      *string  `json:"status_name"`
			Parents         []string `json:"parents"`
			OnParentFailure string   `json:"on_parent_failure"`
			AwaitingParents bool     `json:"awaiting_parents"`
		} `json:"tasks"`
		Truncated bool `json:"truncated"`
	}
	e.want(200, "GET", "/api/v1/tasks/"+s.Refs["mid"]+"/graph", nil).decode(t, &g)
	require.Equal(t, s.Refs["mid"], g.ID)
	require.Len(t, g.Tasks, 3)
	require.Equal(t, []string{s.Refs["root"], s.Refs["mid"], s.Refs["leaf"]}, []string{g.Tasks[0].ID, g.Tasks[1].ID, g.Tasks[2].ID})
	require.Equal(t, []int{-1, 0, 1}, []int{g.Tasks[0].Depth, g.Tasks[1].Depth, g.Tasks[2].Depth})
	require.Equal(t, "queued", *g.Tasks[0].StatusName)
	require.Equal(t, -4, g.Tasks[1].Status)
	require.True(t, g.Tasks[1].AwaitingParents)
	require.Equal(t, []string{s.Refs["root"]}, g.Tasks[1].Parents)
	require.Equal(t, "fail", g.Tasks[1].OnParentFailure)
	require.Equal(t, "run", g.Tasks[2].OnParentFailure)
	require.False(t, g.Truncated)
	e.wantErr(404, CodeNotFound, "id", "GET", "/api/v1/tasks/"+bson.NewObjectID().Hex()+"/graph", nil)
	e.wantErr(400, CodeInvalidParameter, "id", "GET", "/api/v1/tasks/nope/graph", nil)
}

// TestTaskRetryReblocksGraph: a retry's answer counts the descendants it
// held again for their parents.
func TestTaskRetryReblocksGraph(t *testing.T) {
	e := setup(t)
	e.newQueue("a")
	var s graphSubmitted
	e.want(201, "POST", "/api/v1/tasks", `{"queue":"a","tasks":[
		{"ref":"root","params":{}},
		{"ref":"child","params":{},"parents":["root"]}]}`).decode(t, &s)
	e.finished(s.Refs["root"], schema.StatusFailed)
	e.setTask(s.Refs["child"], bson.D{{Key: "status", Value: int32(schema.StatusFailed)}, {Key: "reason", Value: schema.ReasonParentFailed}})
	var res RetryResult
	e.want(200, "POST", "/api/v1/tasks/"+s.Refs["root"]+"/retry", nil).decode(t, &res)
	require.Equal(t, RetryResult{Requeued: 1, Reblocked: 1, Skipped: []Skipped{}}, res)
	require.Equal(t, int32(-4), e.rawTask(s.Refs["child"]).Lookup("status").Int32())
}
