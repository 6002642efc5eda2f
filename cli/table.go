package cli

import (
	"io"
	"strconv"
	"strings"
	"unicode"

	"golang.org/x/text/width"
)

// table prints rows as columns two spaces apart, each cell padded to its
// column's display width (as text/tabwriter would, but counting a wide
// East Asian character as two columns and a combining mark as none, so
// that names in any script line up), the last column unpadded. A cell's
// control characters are shown escaped (\t, \n, \x1b): a queue named with
// a tab cannot shift the columns after it.
type table struct {
	rows [][]string
}

// row adds a row of cells.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = printable(c)
	}
	t.rows = append(t.rows, cells)
}

// print writes the table to w.
func (t *table) print(w io.Writer) error {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-displayWidth(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// printable escapes s's control characters, as Go quotes them.
func printable(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// displayWidth is how many terminal columns s takes.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		n += runeWidth(r)
	}
	return n
}

func runeWidth(r rune) int {
	switch {
	case unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf):
		return 0 // combining marks, zero-width joiners
	}
	switch width.LookupRune(r).Kind() {
	case width.EastAsianWide, width.EastAsianFullwidth:
		return 2
	}
	return 1
}

// clip cuts s to at most n columns, ending it with "..." when cut, and
// never inside a character.
func clip(s string, n int) string {
	if displayWidth(s) <= n {
		return s
	}
	w := 0
	for i, r := range s {
		if w+runeWidth(r) > n-3 {
			return s[:i] + "..."
		}
		w += runeWidth(r)
	}
	return s
}
