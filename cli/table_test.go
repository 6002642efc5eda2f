package cli

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestTablesLineUpInAnyScript: columns line up by display width (a wide
// East Asian character takes two columns, a combining accent none), a
// cell's tab or newline is shown escaped rather than shifting the columns,
// and the last column is not padded.
func TestTablesLineUpInAnyScript(t *testing.T) {
	var tw table
	tw.row("NAME", "MAXTHREADS", "ID")
	tw.row("日本語キュー", "5", "a")
	tw.row("cafe\u0301", "12", "b")
	tw.row("in\tside", "3", "c")
	var b strings.Builder
	require.NoError(t, tw.print(&b))
	want := "" +
		"NAME          MAXTHREADS  ID\n" +
		"日本語キュー  5           a\n" +
		"cafe\u0301          12          b\n" +
		"in\\tside      3           c\n"
	require.Equal(t, want, b.String())
	for _, line := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		last := line[strings.LastIndexByte(line, ' ')+1:]
		require.Equal(t, 26, displayWidth(line)-displayWidth(last), "the last column starts at column 26: %q", line)
	}
}

// TestClipNeverCutsACharacter: a long cell is cut to its columns by whole
// characters, and says it was.
func TestClipNeverCutsACharacter(t *testing.T) {
	s := `{"s":"` + strings.Repeat("é", 80) + `"}`
	c := clip(s, 60)
	require.True(t, utf8.ValidString(c), "%q", c)
	require.True(t, strings.HasSuffix(c, "..."))
	require.Equal(t, 60, displayWidth(c))
	require.Equal(t, "short", clip("short", 60))
	wide := clip(strings.Repeat("日", 40), 60)
	require.LessOrEqual(t, displayWidth(wide), 60)
	require.True(t, utf8.ValidString(wide))
}
