//go:build unix

package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// script writes an executable #!/bin/sh script into a temporary directory.
// The file is written by a child process (cp): a file this process held open
// for writing could be inherited, for an instant, by a process another
// parallel test forks, and exec would then fail with ETXTBSY.
func script(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "script.txt"), filepath.Join(dir, "plugin.sh")
	require.NoError(t, os.WriteFile(src, []byte("#!/bin/sh\n"+body+"\n"), 0o644))
	out, err := exec.Command("cp", src, dst).CombinedOutput()
	require.NoError(t, err, string(out))
	require.NoError(t, os.Chmod(dst, 0o755))
	return dst
}

func externalTask(t *testing.T) Task {
	return Task{
		ID:          bson.NewObjectID(),
		QueueID:     bson.NewObjectID(),
		Queue:       "ext queue",
		Constructor: "My::Plugin",
		Node:        "node-b",
		Attempt:     3,
		Parameters: params(t, bson.D{
			{Key: "who", Value: `world "<&>"`},
			{Key: "n", Value: int32(42)},
			{Key: "big", Value: int64(1) << 40},
			{Key: "when", Value: bson.DateTime(1700000000000)},
			{Key: "ref", Value: bson.ObjectID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
			{Key: "list", Value: bson.A{"x", 1.5}},
		}),
		Config: params(t, bson.D{{Key: "bucket", Value: "b1"}, {Key: "depth", Value: int32(2)}}),
	}
}

// echoInput answers success with its stdin as stdout and its task id (from
// the environment) as stderr; it also writes noise to its own stderr, which a
// successful answer drops.
const echoInput = `in=$(cat | sed 's/\\/\\\\/g; s/"/\\"/g')
echo noise >&2
printf '{"status": 1, "stdout": "%s", "stderr": "%s"}\n' "$in" "$DISBATCH_TASK_ID"`

func TestExternalValid(t *testing.T) {
	t.Parallel()
	tk := externalTask(t)
	res := External(script(t, echoInput)).Run(t.Context(), tk)
	require.Equal(t, schema.StatusSucceeded, res.Status, res.Stderr)
	require.Equal(t, tk.ID.Hex(), res.Stderr)

	var in map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &in), res.Stdout)
	require.Equal(t, map[string]any{
		"id":          tk.ID.Hex(),
		"queue":       "ext queue",
		"queue_id":    tk.QueueID.Hex(),
		"constructor": "My::Plugin",
		"node":        "node-b",
		"attempt":     3.0,
		"parameters": map[string]any{
			"who":  `world "<&>"`,
			"n":    42.0,
			"big":  float64(1 << 40),
			"when": map[string]any{"$date": "2023-11-14T22:13:20Z"},
			"ref":  map[string]any{"$oid": "0102030405060708090a0b0c"},
			"list": []any{"x", 1.5},
		},
		"config": map[string]any{"bucket": "b1", "depth": 2.0},
	}, in)
	require.NotContains(t, res.Stdout, `\u003c`, "no HTML escaping")
	require.True(t, strings.HasPrefix(res.Stdout, `{"id":`), "keys in documented order")

	// No parameters: {}.
	res = External(script(t, echoInput)).Run(t.Context(), Task{})
	require.Equal(t, schema.StatusSucceeded, res.Status, res.Stderr)
	require.Contains(t, res.Stdout, `"attempt":1,"parameters":{},"config":{}`, "a task that never ran is on its first attempt; no config: {}")
}

func TestExternalArgsAndAnswers(t *testing.T) {
	t.Parallel()
	p := External(script(t, `cat > /dev/null; printf '{"status": %s, "stdout": "%s", "extra": [1]}' "$1" "$2"`), "3", "three")
	require.Equal(t, Result{Status: 3, Stdout: "three"}, p.Run(t.Context(), Task{}))

	// Not reading stdin, blank space around the answer, 1.0, null stderr.
	p = External(script(t, `printf '\n  {"stderr": null, "status": 1.0, "stdout": "ok"}  \n\n'`))
	require.Equal(t, Result{Status: 1, Stdout: "ok"}, p.Run(t.Context(), externalTask(t)))

	p = External(script(t, `echo '{"status": 2, "stderr": "plugin failure"}'; echo dropped >&2`))
	require.Equal(t, Result{Status: 2, Stderr: "plugin failure"}, p.Run(t.Context(), Task{}))
}

func TestExternalGarbage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		out, why string
	}{
		{`this is not json`, "not a JSON object"},
		{``, "no output"},
		{`{"status": 1`, "not a JSON object: unexpected EOF"},
		{`[1]`, "not a JSON object"},
		{`{"status": 1}{"status": 1}`, "more than one JSON value"},
		{`{"status": 1} trailing`, "more than one JSON value"},
		{`{"stdout": "x"}`, "no status"},
		{`{"status": null}`, "no status"},
		{`{"status": "1"}`, `status "1" is not a number`},
		{`{"status": true}`, `status true is not a number`},
		{`{"status": 1, "stdout": 5}`, "stdout is not a string"},
		{`{"status": 1, "stderr": ["x"]}`, "stderr is not a string"},
		{`{"status": 1, "output": "x"}`, "output must be an object or a list of objects"},
		{`{"status": 1, "output": [{}, 2]}`, "output must be an object or a list of objects: item 1"},
	} {
		body := "cat > /dev/null; echo 'own stderr' >&2; printf '%s' '" + tc.out + "'"
		path := script(t, body)
		res := External(path).Run(t.Context(), Task{})
		require.Equal(t, schema.StatusFailed, res.Status, tc.out)
		require.Equal(t, tc.out, res.Stdout, "the raw answer is kept")
		require.True(t, strings.HasPrefix(res.Stderr, "own stderr\nplugin "+path+" answered garbage: "+tc.why), "%s: %s", tc.out, res.Stderr)
		require.Contains(t, res.Stderr, tc.why)
	}
}

func TestExternalInvalidStatus(t *testing.T) {
	t.Parallel()
	for _, st := range []string{"0", "-1", "1.5", "2147483648", "-0.5", "1e100"} {
		path := script(t, `cat > /dev/null; echo 'own' >&2; echo '{"status": `+st+`, "stdout": "o", "stderr": "e"}'`)
		res := External(path).Run(t.Context(), Task{})
		require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "o",
			Stderr: "e\nown\nplugin " + path + " answered an invalid status " + st + ": want a positive integer\n"}, res, st)
	}
}

func TestExternalCrash(t *testing.T) {
	t.Parallel()
	path := script(t, `echo 'something broke' >&2; exit 3`)
	res := External(path).Run(t.Context(), externalTask(t))
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "something broke\nplugin " + path + " exited with status 3\n"}, res)

	// A valid answer does not save a crash.
	path = script(t, `echo '{"status": 1}'; exit 1`)
	res = External(path).Run(t.Context(), Task{})
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "{\"status\": 1}\n", Stderr: "plugin " + path + " exited with status 1\n"}, res)

	path = script(t, `echo '{"status": 1}'; kill -SEGV $$`)
	res = External(path).Run(t.Context(), Task{})
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Equal(t, "plugin "+path+" was terminated by signal: segmentation fault\n", res.Stderr)

	res = External("/no/such/plugin").Run(t.Context(), Task{})
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "cannot run plugin /no/such/plugin")

	res = External(script(t, echoInput)).Run(t.Context(), Task{Parameters: bson.Raw{1, 2}})
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "cannot encode the task")
}

func TestExternalTimeout(t *testing.T) {
	t.Parallel()
	path := script(t, `echo 'started' >&2; sleep 30; echo '{"status": 1}'`)
	start := time.Now()
	res := Run(t.Context(), External(path), Task{}, time.Second)
	require.Less(t, time.Since(start), time.Second+slack)
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "started\nplugin " + path + " killed after timeout of 1s\n"}, res)

	// Called directly, it returns as soon as the group is killed (the sleep
	// child would otherwise hold stdout open for WaitDelay).
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(time.Second, func() { cancel(errors.New("node shutdown")) }) // after "started", even on a loaded machine
	start = time.Now()
	res = External(path).Run(ctx, Task{})
	require.Less(t, time.Since(start), time.Second+1500*time.Millisecond)
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "started\nplugin " + path + " killed: node shutdown\n"}, res)
}

func TestExternalThroughRegistry(t *testing.T) {
	t.Parallel()
	r := NewRegistry()
	r.Register("My::Plugin", External(script(t, `cat > /dev/null; echo '{"status": 1, "stdout": "registered"}'`)))
	p, ok := r.Lookup("My::Plugin")
	require.True(t, ok)
	require.Equal(t, Result{Status: 1, Stdout: "registered"}, Run(t.Context(), p, externalTask(t), time.Minute))
}

// TestExternalOutput: an answer's output (extended JSON) reaches the
// Result as an object or a list of objects; null is none.
func TestExternalOutput(t *testing.T) {
	t.Parallel()
	run := func(out string) Result {
		return External(script(t, "cat > /dev/null; printf '%s' '"+out+"'")).Run(t.Context(), Task{})
	}
	res := run(`{"status": 1, "output": {"n": 1, "when": {"$date": "2026-11-23T00:00:00Z"}}}`)
	require.Equal(t, schema.StatusSucceeded, res.Status, res.Stderr)
	d := res.Output.Document()
	require.Equal(t, int32(1), d.Lookup("n").Int32())
	require.Equal(t, bson.TypeDateTime, d.Lookup("when").Type, "extended JSON")
	res = run(`{"status": 1, "output": [{"a": 1}, {"a": 2}]}`)
	ps, err := schema.OutputParams(res.Output)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	require.Zero(t, run(`{"status": 1, "output": null}`).Output.Type, "null: no output")
}

// TestExternalOutputOverItsLimit: an output over schema.MaxOutputBytes is
// garbage (it could never be kept in the task's document, and its finish
// failed for good, leaving the task running).
func TestExternalOutputOverItsLimit(t *testing.T) {
	t.Parallel()
	n := schema.MaxOutputBytes + 1024
	path := script(t, fmt.Sprintf(`cat > /dev/null; printf '{"status": 1, "output": {"blob": "'; head -c %d /dev/zero | tr '\0' x; printf '"}}'`, n))
	res := External(path).Run(t.Context(), Task{})
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "answered garbage: output of ")
	require.Contains(t, res.Stderr, "is over the 8 MiB an output may be")
}
