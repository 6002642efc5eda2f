package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func problemsText(ps []problem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func TestParseTasksJSONLinesReportsBadLinesByNumber(t *testing.T) {
	t.Parallel()
	in := `{"commands":"a"}

{"commands": "b"
[1,2]
42
"text"
null
{"id":{"$oid":"571f8951b75bf335634ec271"},"n":{"$numberLong":"5"}}
   {"spaced": true}   
`
	items, problems, err := parseTasks(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, []string{
		"line 3: invalid JSON: unexpected end of JSON input",
		"line 4: parameters must be a JSON object, got an array",
		"line 5: parameters must be a JSON object, got a number",
		"line 6: parameters must be a JSON object, got a string",
		"line 7: parameters must be a JSON object, got null",
	}, problemsText(problems))
	require.Len(t, items, 3)
	require.Equal(t, []int{1, 8, 9}, []int{items[0].line, items[1].line, items[2].line})
	require.Equal(t, "a", items[0].params.Lookup("commands").StringValue())
	require.Equal(t, "571f8951b75bf335634ec271", items[1].params.Lookup("id").ObjectID().Hex(), "extended JSON is understood")
	require.Equal(t, int64(5), items[1].params.Lookup("n").Int64())
}

func TestParseTasksArrayReportsElementLines(t *testing.T) {
	t.Parallel()
	in := "[\n  {\"a\": 1},\n  \"oops\",\n  {\"b\":\n    2},\n  7\n]\n"
	items, problems, err := parseTasks(strings.NewReader(in))
	require.NoError(t, err)
	require.Equal(t, []string{
		"line 3: parameters must be a JSON object, got a string",
		"line 6: parameters must be a JSON object, got a number",
	}, problemsText(problems))
	require.Len(t, items, 2)
	require.Equal(t, 2, items[0].line)
	require.Equal(t, 4, items[1].line)

	// A broken array stops parsing where it breaks.
	items, problems, err = parseTasks(strings.NewReader("[\n{\"a\":1},\n{\"b\" 2}\n]"))
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0].String(), "line 3: invalid JSON")

	_, problems, err = parseTasks(strings.NewReader("[{\"a\":1}"))
	require.NoError(t, err)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0].String(), "not closed")
}

func TestParseTasksRejectsParametersOverTheDocumentLimit(t *testing.T) {
	t.Parallel()
	huge := `{"blob":"` + strings.Repeat("x", 17<<20) + `"}` + "\n" + `{"ok":1}`
	items, problems, err := parseTasks(strings.NewReader(huge))
	require.NoError(t, err)
	require.Len(t, items, 1)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0].String(), "line 1: parameters are 17825808 bytes as BSON")
	require.Contains(t, problems[0].String(), "16 MiB")
}
