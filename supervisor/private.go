package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// checkPrivate refuses a state directory another user could tamper with:
// the sockets in it carry each task's spec, its connection string
// included, to whoever listens on them. dir must be a directory (not a
// symbolic link) owned by this user and writable by no one else; its
// parent must be this user's or root's, and writable by no one else unless
// it is sticky (as /tmp is: no one may rename another's entries there).
func checkPrivate(dir string) error {
	uid := uint32(os.Getuid())
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("state directory %s is not a directory (a symbolic link?): choose another --state-dir", dir)
	case ok && st.Uid != uid:
		return fmt.Errorf("state directory %s belongs to uid %d, not to this user (uid %d): another user made it; remove it, or choose another --state-dir", dir, st.Uid, uid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("state directory %s is writable by others (mode %v): chmod go-w it, or choose another --state-dir", dir, fi.Mode().Perm())
	}
	parent := filepath.Dir(dir)
	pi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("state directory's parent: %w", err)
	}
	pst, ok := pi.Sys().(*syscall.Stat_t)
	switch {
	case ok && pst.Uid != uid && pst.Uid != 0:
		return fmt.Errorf("state directory %s is in %s, which belongs to uid %d, who could replace it: choose another --state-dir", dir, parent, pst.Uid)
	case pi.Mode().Perm()&0o022 != 0 && pi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("state directory %s is in %s, which others may write to (mode %v) and which is not sticky: choose another --state-dir", dir, parent, pi.Mode().Perm())
	}
	return nil
}
