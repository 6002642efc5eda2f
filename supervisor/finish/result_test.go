package finish

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/supervisor"
)

// detached runs t's plugin p as a supervised task is run: Prepare in the
// node, the Command in the supervisor, the Outcome through the state
// directory's file, and Result in the node.
func detached(t *testing.T, ctx context.Context, p plugin.Detachable, task plugin.Task) plugin.Result {
	t.Helper()
	c, bad := p.Prepare(task)
	if bad != nil {
		return *bad
	}
	named, err := json.Marshal(p.Detached())
	require.NoError(t, err)
	dir, id := t.TempDir(), task.ID.Hex()
	require.NoError(t, supervisor.WriteOutcome(dir, id, supervisor.Outcome{Proc: c.Run(ctx)}))
	o, err := supervisor.ReadOutcome(dir, id)
	require.NoError(t, err)
	res, err := Result(supervisor.Spec{Plugin: named, Command: c}, o)
	require.NoError(t, err)
	return res
}

// TestDetachedResultsAreTheInProcessOnes: a task run under a supervisor
// gets the result its plugin gives in the node, for each detachable
// plugin, through success, failure, signals, kills and bad parameters.
func TestDetachedResultsAreTheInProcessOnes(t *testing.T) {
	task := func(params bson.D) plugin.Task {
		raw, err := bson.Marshal(params)
		require.NoError(t, err)
		return plugin.Task{ID: bson.NewObjectID(), QueueID: bson.NewObjectID(), Queue: "q", Constructor: "c", Node: "n", Parameters: raw}
	}
	ext := plugin.External("bash", "-c", `read -r line; printf '{"status":1,"stdout":"read %d bytes","output":{"n":2}}' ${#line}`)
	extBad := plugin.External("bash", "-c", `cat >/dev/null; echo not json`)
	cases := []struct {
		name string
		p    plugin.Plugin
		t    plugin.Task
		kill bool
	}{
		{"shell ok", plugin.Shell(), task(bson.D{{Key: "command", Value: "echo out; sleep 0.05; echo err >&2"}}), false},
		{"shell exit 3", plugin.Shell(), task(bson.D{{Key: "command", Value: "echo x; exit 3"}}), false},
		{"shell signal", plugin.Shell(), task(bson.D{{Key: "command", Value: "kill -TERM $$"}}), false},
		{"shell killed", plugin.Shell(), task(bson.D{{Key: "command", Value: "echo started; sleep 30"}}), true},
		{"shell no command", plugin.Shell(), task(bson.D{}), false},
		{"exec args", plugin.Exec(), task(bson.D{{Key: "command", Value: "printf"}, {Key: "args", Value: bson.A{"%s-%s", "a", "b"}}}), false},
		{"exec missing", plugin.Exec(), task(bson.D{{Key: "command", Value: "/no/such/program"}}), false},
		{"external", ext, task(bson.D{{Key: "a", Value: 1}}), false},
		{"external garbage", extBad, task(bson.D{}), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := func(f func(context.Context) plugin.Result) plugin.Result {
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				if c.kill {
					time.AfterFunc(300*time.Millisecond, func() { cancel(&supervisor.Killed{Text: "kill requested"}) })
				}
				return f(ctx)
			}
			here := run(func(ctx context.Context) plugin.Result { return c.p.Run(ctx, c.t) })
			there := run(func(ctx context.Context) plugin.Result { return detached(t, ctx, c.p.(plugin.Detachable), c.t) })
			require.Equal(t, here, there)
			if c.kill {
				require.Equal(t, schema.StatusFailed, there.Status)
				require.Contains(t, there.Stderr, "killed: kill requested")
			}
		})
	}
}

func TestAFailureBeforeTheStartIsTheResult(t *testing.T) {
	res, err := Result(supervisor.Spec{}, supervisor.Outcome{Failure: "task killed: supervisor fenced before the start\n", Fenced: true})
	require.NoError(t, err)
	require.Equal(t, plugin.Result{Status: schema.StatusFailed, Stderr: "task killed: supervisor fenced before the start\n"}, res)
}

func TestAPluginTimeoutReadsAsOne(t *testing.T) {
	ctx, cancel := proc.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	res := detached(t, ctx, plugin.Shell().(plugin.Detachable), plugin.Task{ID: bson.NewObjectID(), Parameters: mustParams(t, "sleep 30")})
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "command killed after timeout of 100ms")
}

func mustParams(t *testing.T, command string) bson.Raw {
	raw, err := bson.Marshal(bson.D{{Key: "command", Value: command}})
	require.NoError(t, err)
	return raw
}
