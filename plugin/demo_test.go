package plugin

import (
	"strings"
	"testing"

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

func TestDemoBadCommands(t *testing.T) {
	t.Parallel()
	const reason = "parameters.commands must be a string of command letters"
	for name, tk := range map[string]Task{
		"nil parameters":   {},
		"empty parameters": {Parameters: params(t, bson.D{})},
		"other parameters": {Parameters: params(t, bson.D{{Key: "command", Value: "a"}})},
		"null":             {Parameters: params(t, bson.D{{Key: "commands", Value: nil}})},
		"number":           {Parameters: params(t, bson.D{{Key: "commands", Value: 1}})},
		"array":            {Parameters: params(t, bson.D{{Key: "commands", Value: bson.A{"a"}}})},
		"invalid BSON":     {Parameters: bson.Raw{1, 2, 3}},
	} {
		res := Demo().Run(t.Context(), tk)
		require.Equal(t, schema.StatusFailed, res.Status, name)
		require.Contains(t, res.Stderr, reason, name)
		require.Empty(t, res.Stdout, name)
	}
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
