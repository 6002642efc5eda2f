package auth

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// The kinds of line in the credentials file.
const (
	KindUser  = "user"  // a name and a password, for HTTP Basic
	KindToken = "token" // a bearer token
)

const (
	maxNameLen = 64
	maxLineLen = 4 << 10
)

// entry is one line of the file.
type entry struct {
	kind string
	name string
	role Role
	hash hash
}

// LoadFile reads a credentials file (see the package documentation).
// Its errors name the file and the line, never a secret.
func LoadFile(path string) (*Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load credentials: %w", err)
	}
	defer f.Close()
	u, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("load credentials file %s: %w", path, err)
	}
	return u, nil
}

// Parse reads credentials in the file format (see the package
// documentation). Names are unique across users and tokens. Its errors
// name the line, never a secret.
func Parse(r io.Reader) (*Users, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1024), maxLineLen)
	var entries []entry
	seen := map[string]int{} // name → line
	n := 0
	for sc.Scan() {
		n++
		e, ok, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if !ok {
			continue
		}
		if first, dup := seen[e.name]; dup {
			return nil, fmt.Errorf("line %d: duplicate name %q (first on line %d): names are unique across users and tokens", n, e.name, first)
		}
		seen[e.name] = n
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than %d bytes", n+1, maxLineLen)
		}
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	if len(entries) == 0 {
		return nil, errors.New("no user or token lines: add one with disbatch-web passwd or disbatch-web token, or turn authentication off")
	}
	return newUsers(entries), nil
}

// parseLine parses one line; ok is false for a blank line or a comment.
func parseLine(line string) (e entry, ok bool, err error) {
	line = strings.TrimSpace(line)
	if line == "" || strings.HasPrefix(line, "#") {
		return entry{}, false, nil
	}
	f := strings.Fields(line)
	if len(f) != 4 {
		return entry{}, false, fmt.Errorf(`want 4 fields "KIND NAME ROLE HASH", got %d`, len(f))
	}
	e.kind, e.name = f[0], f[1]
	if e.kind != KindUser && e.kind != KindToken {
		return entry{}, false, fmt.Errorf("unknown kind: want %s or %s first", KindUser, KindToken)
	}
	if err := CheckName(e.name); err != nil {
		return entry{}, false, err
	}
	if e.role, err = ParseRole(f[2]); err != nil {
		// Not ParseRole's error: it quotes the field, which could be a
		// password typed in the wrong column.
		return entry{}, false, fmt.Errorf("%s %q: unknown role: want read, write or admin", e.kind, e.name)
	}
	if e.hash, err = parseHash(f[3]); err != nil {
		return entry{}, false, fmt.Errorf("hash of %s %q: %w", e.kind, e.name, err)
	}
	if e.kind == KindUser && !e.hash.expensive() {
		return entry{}, false, fmt.Errorf("hash of user %q: a password needs %s (a plain %s is fast enough to guess passwords with); make one with disbatch-web passwd", e.name, SchemePBKDF2, SchemeSHA256)
	}
	return e, true, nil
}

// CheckName returns an error unless name may name a user or a token: 1 to
// 64 characters of letters, digits, '.', '_', '@' and '-', not starting
// with a punctuation mark.
func CheckName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("name %q: want 1 to %d characters", name, maxNameLen)
	}
	for i, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '@' || c == '-'):
		default:
			return fmt.Errorf("name %q: use letters, digits and . _ @ - (not first)", name)
		}
	}
	return nil
}

// Line formats a line of the credentials file: kind is KindUser or
// KindToken, hash comes from HashPassword, HashToken or NewToken. It does
// not check its arguments; Parse does.
func Line(kind, name string, role Role, hash string) string {
	return kind + " " + name + " " + role.String() + " " + hash
}
