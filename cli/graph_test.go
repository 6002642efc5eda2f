package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func (e *env) taskDoc(id string) bson.Raw {
	e.t.Helper()
	oid, err := bson.ObjectIDFromHex(id)
	require.NoError(e.t, err)
	raw, err := e.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "_id", Value: oid}}).Raw()
	require.NoError(e.t, err)
	return raw
}

// TestSubmitGraphResolvesRefsAcrossQueues: refs become the ids of the
// tasks named, a line's queue overrides QUEUE, a stored task's id is a
// parent too; children wait (-4) for their parents.
func TestSubmitGraphResolvesRefsAcrossQueues(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "a", "--constructor", "X")
	e.ok("", "queue", "create", "b", "--constructor", "X")
	var stored struct {
		First string `json:"first"`
	}
	require.NoError(t, json.Unmarshal([]byte(e.ok(`{"x":1}`, "task", "submit", "b", "--json")), &stored))
	in := `{"ref":"fetch","parameters":{"url":"u"}}
{"ref":"build","queue":"b","parents":["fetch","` + stored.First + `"],"on_parent_failure":"run"}
{"parents":["build"],"parameters":{"step":3}}
`
	var res struct {
		Submitted int               `json:"submitted"`
		IDs       []string          `json:"ids"`
		Refs      map[string]string `json:"refs"`
	}
	require.NoError(t, json.Unmarshal([]byte(e.ok(in, "task", "submit", "a", "--graph", "--json")), &res))
	require.Equal(t, 3, res.Submitted)
	require.Equal(t, map[string]string{"fetch": res.IDs[0], "build": res.IDs[1]}, res.Refs)

	fetch, build, last := e.taskDoc(res.IDs[0]), e.taskDoc(res.IDs[1]), e.taskDoc(res.IDs[2])
	require.Equal(t, int32(-2), fetch.Lookup("status").Int32())
	require.Equal(t, "u", fetch.Lookup("parameters", "url").StringValue())
	require.Equal(t, int32(-4), build.Lookup("status").Int32())
	require.True(t, build.Lookup("awaiting_parents").Boolean())
	require.Equal(t, "run", build.Lookup("on_parent_failure").StringValue())
	parents, _ := build.Lookup("parents").Array().Values()
	require.Len(t, parents, 2)
	require.Equal(t, res.IDs[0], parents[0].ObjectID().Hex())
	require.Equal(t, stored.First, parents[1].ObjectID().Hex())
	require.Equal(t, fetch.Lookup("queue").ObjectID(), last.Lookup("queue").ObjectID(), "QUEUE by default")
	require.NotEqual(t, fetch.Lookup("queue").ObjectID(), build.Lookup("queue").ObjectID(), "the line's queue")
	lastParents, _ := last.Lookup("parents").Array().Values()
	require.Equal(t, res.IDs[1], lastParents[0].ObjectID().Hex())

	out := e.ok(`{"ref":"x"}`+"\n"+`{"ref":"y","parents":["x"]}`, "task", "submit", "a", "--graph")
	require.Contains(t, out, "submitted a graph of 2 tasks")
	require.Regexp(t, `(?m)^  [0-9a-f]{24}\s+y$`, out)
}

// TestSubmitGraphRefusesBadGraphs: each bad input is reported by line,
// exits 1 and inserts nothing.
func TestSubmitGraphRefusesBadGraphs(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "a", "--constructor", "X")
	ghost := bson.NewObjectID().Hex()
	many := make([]string, 1001)
	for i := range many {
		many[i] = `"` + bson.NewObjectID().Hex() + `"`
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"unknown ref", `{"ref":"a"}` + "\n" + `{"parents":["b"]}`, `line 2: parent "b" is neither a ref of this input nor a task id`},
		{"self", `{"ref":"a","parents":["a"]}`, `line 1: a task cannot be its own parent`},
		{"duplicate ref", `{"ref":"a"}` + "\n" + `{"ref":"a"}`, `line 2: ref "a" is also line 1's`},
		{"cycle", `{"ref":"a","parents":["c"]}` + "\n" + `{"ref":"b","parents":["a"]}` + "\n" + `{"ref":"c","parents":["b"]}`, `line 1: a cycle of parents: "a" -> "c" -> "b" -> "a"`},
		{"unknown parent id", `{"parents":["` + ghost + `"]}`, "line 1: parent " + ghost + ": no such task"},
		{"unknown queue", `{"queue":"nope"}`, `line 1: no queue "nope"`},
		{"too many parents", `{"parents":[` + strings.Join(many, ",") + `]}`, "line 1: 1001 parents; a task may have at most 1000"},
		{"unknown key", `{"ref":"a","paramters":{}}`, `line 1: unknown key "paramters"`},
	} {
		r := e.run(tc.in, "task", "submit", "a", "--graph")
		require.Equal(t, 1, r.code, "%s: %s", tc.name, r.err)
		require.Contains(t, r.err, tc.want, tc.name)
		require.Contains(t, r.err, "nothing was inserted", tc.name)
		require.Zero(t, e.count("tasks", bson.D{}), tc.name)
	}
	r := e.run(`{"ref":"a"}`, "task", "submit", "a", "--graph", "--skip-invalid")
	require.Equal(t, 2, r.code)
	// Without --graph a graph-shaped line is plain parameters, with a hint.
	r = e.run(`{"ref":"a","parameters":{}}`, "task", "submit", "a")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.err, "for a task graph use --graph")
}

// TestTaskGraphShowsAncestorsAndDescendants: the table and --json.
func TestTaskGraphShowsAncestorsAndDescendants(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "a", "--constructor", "X")
	var res struct {
		Refs map[string]string `json:"refs"`
	}
	in := `{"ref":"root"}
{"ref":"left","parents":["root"]}
{"ref":"right","parents":["root"]}
{"ref":"join","parents":["left","right"]}
{"ref":"other"}
`
	require.NoError(t, json.Unmarshal([]byte(e.ok(in, "task", "submit", "a", "--graph", "--json")), &res))
	_, err := e.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: e.taskDoc(res.Refs["root"]).Lookup("_id").ObjectID()}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 2}, {Key: "reason", Value: "timeout"}}}})
	require.NoError(t, err)

	out := e.ok("", "task", "graph", res.Refs["left"])
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^DEPTH\s+ID\s+STATUS\s+REASON\s+QUEUE\s+PARENTS$`, lines[0])
	require.Regexp(t, `^-1\s+`+res.Refs["root"]+`\s+failed\s+timeout\s+a\s+-$`, lines[1])
	require.Regexp(t, `^0 \*\s+`+res.Refs["left"]+`\s+blocked \(parents\)\s+-\s+a\s+`+res.Refs["root"]+`$`, lines[2])
	require.Regexp(t, `^\+1\s+`+res.Refs["join"]+`\s+blocked \(parents\)`, lines[3])
	require.NotRegexp(t, `(?m)^\S+( \*)?\s+`+res.Refs["right"], out, "a sibling is neither ancestor nor descendant")
	require.NotContains(t, out, res.Refs["other"])

	var view struct {
		ID    string `json:"id"`
		Tasks []struct {
			ID         string   `json:"id"`
			Depth      int      `json:"depth"`
			StatusName string   `json:"status_name"`
			Parents    []string `json:"parents"`
		} `json:"tasks"`
		Truncated bool `json:"truncated"`
	}
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "graph", res.Refs["root"], "--json")), &view))
	require.Equal(t, res.Refs["root"], view.ID)
	require.Len(t, view.Tasks, 4)
	require.Equal(t, 0, view.Tasks[0].Depth)
	require.Equal(t, "failed", view.Tasks[0].StatusName)
	require.Equal(t, 2, view.Tasks[3].Depth)
	require.Equal(t, res.Refs["join"], view.Tasks[3].ID)
	require.Equal(t, []string{res.Refs["left"], res.Refs["right"]}, view.Tasks[3].Parents)
	require.False(t, view.Truncated)

	r := e.run("", "task", "graph", bson.NewObjectID().Hex())
	require.Equal(t, 1, r.code)
	r = e.run("", "task", "graph", "nope")
	require.Equal(t, 2, r.code)
}
