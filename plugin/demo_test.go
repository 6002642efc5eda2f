package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

const (
	apple  = "This is command 'a' for apple.\n"
	banana = "This is command 'b' for banana.\n"
	cry    = "This is command 'c' for cry.\n"
)

// params marshals a parameters object.
func params(t *testing.T, d bson.D) bson.Raw {
	t.Helper()
	if d == nil {
		d = bson.D{}
	}
	raw, err := bson.Marshal(d)
	require.NoError(t, err)
	return raw
}

func runDemoCommands(t *testing.T, commands any) Result {
	t.Helper()
	return Demo().Run(t.Context(), Task{Parameters: params(t, bson.D{{Key: "commands", Value: commands}})})
}

func TestDemo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		commands       string
		status         schema.Status
		stdout, stderr string
	}{
		{"a", 1, apple, ""},
		{"ab", 1, apple, banana},
		{"ba", 1, apple, banana},
		{"*", 2, apple, banana + cry},
		{"abc", 2, apple, banana + cry},
		{"cxa", 2, apple, cry},
		{"c", 2, "", cry},
		{"", 1, "", ""},
		{"xyz", 1, "", ""},
		{"**", 1, "", ""}, // only exactly "*" means "abc"
	} {
		res := runDemoCommands(t, tc.commands)
		require.Equal(t, Result{Status: tc.status, Stdout: tc.stdout, Stderr: tc.stderr}, res, "commands %q", tc.commands)
	}
}

func TestDemoBulk(t *testing.T) {
	t.Parallel()
	res := runDemoCommands(t, "1")
	require.Equal(t, schema.StatusSucceeded, res.Status)
	require.Len(t, res.Stdout, 1<<20)
	require.Equal(t, strings.Repeat("1", 1<<20), res.Stdout)
	require.Empty(t, res.Stderr)

	res = runDemoCommands(t, "Ac1a")
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Equal(t, apple+strings.Repeat("1", 1<<20), res.Stdout)
	require.Equal(t, strings.Repeat("A", 1<<20)+cry, res.Stderr)

	res = runDemoCommands(t, "EC8BA71eb")
	require.Equal(t, schema.StatusSucceeded, res.Status)
	require.Equal(t, strings.Repeat("1", 1<<20)+strings.Repeat("7", 7<<20)+
		strings.Repeat("8", 8<<20)+strings.Repeat("e", 15<<20), res.Stdout)
	require.Equal(t, banana+strings.Repeat("A", 1<<20)+strings.Repeat("B", 7<<20)+
		strings.Repeat("C", 8<<20)+strings.Repeat("E", 15<<20), res.Stderr)
}

// TestDemoOddCommandsAsPerl: what 4.103's Demo does with commands that are
// not a string (observed against the real one, see
// integration/compat4103): nothing for none, Perl's string of the rest.
func TestDemoOddCommandsAsPerl(t *testing.T) {
	t.Parallel()
	oneMiB := func(c string) string { return strings.Repeat(c, 1<<20) }
	for name, tc := range map[string]struct {
		task           Task
		status         schema.Status
		stdout, stderr string
	}{
		"nil parameters":   {Task{}, 1, "", ""},
		"empty parameters": {Task{Parameters: params(t, bson.D{})}, 1, "", ""},
		"other parameters": {Task{Parameters: params(t, bson.D{{Key: "command", Value: "a"}})}, 1, "", ""},
		"null":             {Task{Parameters: params(t, bson.D{{Key: "commands", Value: nil}})}, 1, "", ""},
		"number 1":         {Task{Parameters: params(t, bson.D{{Key: "commands", Value: 1}})}, 1, oneMiB("1"), ""},
		"true":             {Task{Parameters: params(t, bson.D{{Key: "commands", Value: true}})}, 1, oneMiB("1"), ""},
		"false":            {Task{Parameters: params(t, bson.D{{Key: "commands", Value: false}})}, 1, "", ""},
		"array":            {Task{Parameters: params(t, bson.D{{Key: "commands", Value: bson.A{"c"}}})}, 1, "", oneMiB("A")},
		"object":           {Task{Parameters: params(t, bson.D{{Key: "commands", Value: bson.D{{Key: "c", Value: 1}}}})}, 1, "", oneMiB("A")},
		"stdout param":     {Task{Parameters: params(t, bson.D{{Key: "commands", Value: "a"}, {Key: "stdout", Value: "pre:"}})}, 1, "pre:" + apple, ""},
		"invalid BSON":     {Task{Parameters: bson.Raw{1, 2, 3}}, 2, "", "Demo: parameters are not a valid BSON document"},
	} {
		res := Demo().Run(t.Context(), tc.task)
		require.Equal(t, tc.status, res.Status, name)
		require.Equal(t, tc.stdout, res.Stdout, name)
		if name == "invalid BSON" {
			require.Contains(t, res.Stderr, tc.stderr, name)
			continue
		}
		require.Equal(t, tc.stderr, res.Stderr, name)
	}
}

type fakeReports struct {
	docs []bson.D
	err  error
}

func (f *fakeReports) ReportInsert(_ context.Context, doc bson.D) error {
	f.docs = append(f.docs, doc)
	return f.err
}

// TestDemoReports: a report per task, as 4.103's Demo writes it, unless
// noreport; a report that cannot be written fails the task.
func TestDemoReports(t *testing.T) {
	t.Parallel()
	d := Demo()
	at := time.Unix(1_800_000_000, 0)
	d.now = func() time.Time { return at }
	r := &fakeReports{}
	d.SetReports(r)
	task := func(p bson.D) Task {
		return Task{ID: bson.NewObjectID(), QueueID: bson.NewObjectID(), Parameters: params(t, p)}
	}
	ok := task(bson.D{{Key: "commands", Value: "ab"}, {Key: "counter", Value: 7}})
	require.Equal(t, schema.StatusSucceeded, d.Run(t.Context(), ok).Status)
	failed := task(bson.D{{Key: "commands", Value: "c"}})
	require.Equal(t, schema.StatusFailed, d.Run(t.Context(), failed).Status)
	for _, noreport := range []any{true, 1, "yes"} {
		d.Run(t.Context(), task(bson.D{{Key: "commands", Value: "a"}, {Key: "noreport", Value: noreport}}))
	}
	d.Run(t.Context(), task(bson.D{{Key: "commands", Value: "a"}, {Key: "noreport", Value: "0"}})) // Perl's false: reported
	require.Len(t, r.docs, 3)
	get := func(doc bson.D, key string) any {
		for _, e := range doc {
			if e.Key == key {
				return e.Value
			}
		}
		return "missing"
	}
	require.Equal(t, int32(7), get(r.docs[0], "counter").(bson.RawValue).Int32())
	require.Equal(t, "ab", get(r.docs[0], "commands").(bson.RawValue).StringValue())
	require.Equal(t, ok.ID, get(r.docs[0], "task_id"))
	require.Equal(t, ok.QueueID, get(r.docs[0], "queue_id"))
	require.Equal(t, DemoVersion, get(r.docs[0], "version"))
	require.Equal(t, at.Unix(), get(r.docs[0], "started"))
	require.Equal(t, at.Unix(), get(r.docs[0], "completed"))
	require.Equal(t, 1, get(r.docs[0], "errors"), "b counts as an error, yet succeeds")
	require.Equal(t, "SUCCESS", get(r.docs[0], "status"))
	require.Equal(t, "missing", get(r.docs[0], "error"))
	require.Equal(t, bson.TypeNull, get(r.docs[1], "counter").(bson.RawValue).Type)
	require.Equal(t, "FAILED", get(r.docs[1], "status"))
	require.Equal(t, "Task failed: This is command 'c' for cry.\n", get(r.docs[1], "error"))

	r.err = errors.New("not authorized on reports")
	res := d.Run(t.Context(), task(bson.D{{Key: "commands", Value: "a"}}))
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "Unable to complete")
	require.Equal(t, apple, res.Stdout)
}

func TestDemoThroughRegistryAndRun(t *testing.T) {
	t.Parallel()
	r := NewRegistry()
	r.Register(DemoConstructor, Demo())
	p, ok := r.Lookup("Disbatch::Plugin::Demo")
	require.True(t, ok)
	res := Run(t.Context(), p, Task{Parameters: params(t, bson.D{{Key: "commands", Value: "*"}})}, 0)
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: apple, Stderr: banana + cry}, res)
}
