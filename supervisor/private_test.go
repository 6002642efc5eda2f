package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAStateDirectoryOthersCouldTamperWithIsRefused: the state directory's
// sockets carry each task's spec (its connection string too), so a
// directory another user made, or may write to, or may replace, is
// refused, saying why; one this user made, in a private or sticky parent,
// is taken.
func TestAStateDirectoryOthersCouldTamperWithIsRefused(t *testing.T) {
	t.Parallel()
	base, err := os.MkdirTemp("", "sd") // short: the sockets' paths are bounded
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	check := func(dir string) error {
		return (&Launcher{Dir: dir, Command: []string{"x"}}).Check()
	}
	require.NoError(t, check(filepath.Join(base, "fresh", "node")), "made here, private")

	open := filepath.Join(base, "open")
	require.NoError(t, os.MkdirAll(filepath.Join(open, "node"), 0o700))
	require.NoError(t, os.Chmod(filepath.Join(open, "node"), 0o777))
	require.ErrorContains(t, check(filepath.Join(open, "node")), "is writable by others")

	shared := filepath.Join(base, "shared")
	require.NoError(t, os.MkdirAll(filepath.Join(shared, "node"), 0o700))
	require.NoError(t, os.Chmod(shared, 0o777))
	require.ErrorContains(t, check(filepath.Join(shared, "node")), "which others may write to")
	require.NoError(t, os.Chmod(shared, 0o777|os.ModeSticky))
	require.NoError(t, check(filepath.Join(shared, "node")), "a sticky parent, as /tmp")

	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(filepath.Join(base, "fresh", "node"), link))
	require.ErrorContains(t, check(link), "is not a directory")

	if os.Getuid() == 0 { // only root can give a directory away
		theirs := filepath.Join(base, "theirs")
		require.NoError(t, os.MkdirAll(theirs, 0o700))
		require.NoError(t, os.Chown(theirs, 4242, 4242))
		require.ErrorContains(t, check(theirs), "belongs to uid 4242")
	} else {
		t.Log("not root: the owner's case is not tried")
	}
}
