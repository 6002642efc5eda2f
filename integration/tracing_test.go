package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/jaegertest"
	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// TestTaskLifecyclesInJaeger runs a real Jaeger, a node process and a
// `disbatch task submit` process with tracing on, then reads the traces back
// from Jaeger's query API: the submitter's span and every task's execution
// spans are one trace, linked parent to child, with their attributes.
func TestTaskLifecyclesInJaeger(t *testing.T) {
	t.Parallel()
	j := jaegertest.Start(t)
	uri, db := mongotest.URI(t), mongotest.Database(t)
	cli(t, uri, db.Name(), "", "queue", "create", "traced", "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "2", "--sort", "fifo")
	n := startNode(t, nodeArgs(uri, db.Name(), "tracer"), append(j.Env(), "OTEL_SERVICE_NAME=disbatchd")...)
	n.waitLog("tracing task lifecycles", 20*time.Second)
	n.waitLog("node started", 20*time.Second)

	r := runBin(t, disbatchBin, `{"commands":"a"}`+"\n"+`{"commands":"c"}`+"\n", append(j.Env(), "OTEL_SERVICE_NAME=disbatch"),
		"--mongo-uri", uri, "--database", db.Name(), "task", "submit", "traced")
	require.Zero(t, r.code, r.stderr)
	ts := waitTasks(t, db, 20*time.Second, "both tasks finished", allFinished)
	ids := map[string]int{}
	for _, x := range ts {
		ids[x.ID.Hex()] = x.Status
	}
	require.Len(t, ids, 2)

	complete := func(tr jaegertest.Trace) bool {
		if _, ok := tr.Span("disbatch.submit"); !ok {
			return false
		}
		tasks, children := 0, 0
		for _, s := range tr.Spans {
			switch s.OperationName {
			case "disbatch.task":
				tasks++
			case "disbatch.queued", "disbatch.claim", "disbatch.run", "disbatch.complete":
				children++
			}
		}
		return tasks == 2 && children == 8
	}
	traces := j.WaitForTraces(t, "disbatch", 30*time.Second, func(trs []jaegertest.Trace) bool {
		for _, tr := range trs {
			if complete(tr) {
				return true
			}
		}
		return false
	})
	var tr jaegertest.Trace
	for _, x := range traces {
		if complete(x) {
			tr = x
		}
	}
	submit, _ := tr.Span("disbatch.submit")
	require.Equal(t, "disbatch", submit.ServiceName)
	require.Equal(t, "traced", submit.Tags["disbatch.queue"])
	require.EqualValues(t, 2, submit.Tags["disbatch.tasks"])

	seen := map[string]bool{}
	for _, task := range tr.Spans {
		if task.OperationName != "disbatch.task" {
			continue
		}
		id, _ := task.Tags["disbatch.task.id"].(string)
		status, known := ids[id]
		require.True(t, known, "a task span for an unknown task: %v", task.Tags)
		seen[id] = true
		require.Equal(t, "disbatchd", task.ServiceName)
		require.Equal(t, submit.SpanID, task.ParentID(), "the task span is the submit span's child:\n%s", tr)
		require.Equal(t, "traced", task.Tags["disbatch.queue"])
		require.Equal(t, "Disbatch::Plugin::Demo", task.Tags["disbatch.constructor"])
		require.Equal(t, "tracer", task.Tags["disbatch.node"])
		require.EqualValues(t, status, task.Tags["disbatch.status"])
		require.Contains(t, task.Tags, "disbatch.queue.wait_ms")
		kids := map[string]jaegertest.Span{}
		for _, s := range tr.Spans {
			if s.ParentID() == task.SpanID {
				kids[s.OperationName] = s
			}
		}
		require.Len(t, kids, 4, "queued, claim, run, complete under task %s:\n%s", id, tr)
		require.False(t, kids["disbatch.run"].StartTime.Before(kids["disbatch.claim"].StartTime))
		require.Equal(t, task.StartTime, kids["disbatch.queued"].StartTime, "the task span starts with its wait in the queue")
		if status == 2 {
			require.Equal(t, "failed", task.Tags["disbatch.outcome"])
			require.Equal(t, true, kids["disbatch.run"].Tags["error"], "a failed run is an error span: %v", kids["disbatch.run"].Tags)
			require.True(t, strings.Contains(tagString(kids["disbatch.run"].Tags["otel.status_description"]), "cry"), "%v", kids["disbatch.run"].Tags)
		} else {
			require.Equal(t, "succeeded", task.Tags["disbatch.outcome"])
		}
	}
	require.Len(t, seen, 2)
}

func tagString(v any) string {
	s, _ := v.(string)
	return s
}
