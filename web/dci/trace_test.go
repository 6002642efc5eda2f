package dci_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// TestASubmitJoinsTheCallersTrace: 4.103's POST /tasks stores the
// request's W3C trace context on the tasks it makes, as the v1 API and the
// CLI do, so that their traces on the node join the caller's; a malformed
// traceparent is not kept.
func TestASubmitJoinsTheCallersTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	status, _, body := b.do("POST", "/queues", "json", `{"name":"q1","plugin":"Disbatch::Plugin::Demo"}`)
	require.Equal(t, 200, status, body)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const ts = "vendor=value"
	submit := func(traceparent string) {
		req, err := http.NewRequest("POST", b.srv.URL+"/tasks", strings.NewReader(`{"queue":"q1","params":[{"a":1},{"a":2}]}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", ts)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		require.Equal(t, 200, resp.StatusCode, string(out))
	}
	submit(tp)
	submit("garbage")
	cur, err := b.db.Collection(schema.CollTasks).Find(context.Background(), bson.D{}, nil)
	require.NoError(t, err)
	var tasks []bson.Raw
	require.NoError(t, cur.All(context.Background(), &tasks))
	require.Len(t, tasks, 4)
	var joined, own int
	for _, raw := range tasks {
		switch v := raw.Lookup(schema.TaskTraceParent); v.Type {
		case bson.TypeString:
			require.Equal(t, tp, v.StringValue())
			require.Equal(t, ts, raw.Lookup(schema.TaskTraceState).StringValue())
			joined++
		case 0:
			require.Equal(t, bson.Type(0), raw.Lookup(schema.TaskTraceState).Type, "a trace state without its parent")
			own++
		default:
			t.Fatalf("trace parent of type %v", v.Type)
		}
	}
	require.Equal(t, [2]int{2, 2}, [2]int{joined, own}, "tasks that joined the caller's trace, and those that did not")
}
