package proc

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCapped(t *testing.T) {
	t.Parallel()
	var c Capped
	n, err := c.Write([]byte("abc"))
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, "abc", c.String())
	big := bytes.Repeat([]byte{'z'}, MaxOutput)
	n, err = c.Write(big)
	require.NoError(t, err, "a full buffer must not fail writes")
	require.Equal(t, len(big), n)
	n, err = c.Write([]byte("more"))
	require.NoError(t, err)
	require.Equal(t, 4, n)
	s := c.String()
	require.Len(t, s, MaxOutput+len(TruncatedNote))
	require.Equal(t, "abczz", s[:5])
	b, cut := c.Bytes()
	require.True(t, cut)
	require.Len(t, b, MaxOutput)

	var exact Capped
	_, _ = exact.Write(big)
	require.Equal(t, string(big), exact.String(), "exactly MaxOutput is not truncated")

	small := Capped{Limit: 4}
	_, _ = small.Write([]byte("abc"))
	_, _ = small.Write([]byte("de"))
	b, cut = small.Bytes()
	require.True(t, cut)
	require.Equal(t, "abcd", string(b))
}
