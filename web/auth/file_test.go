package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseGoodFile(t *testing.T) {
	t.Parallel()
	pw := cheapHash(t, "pw")
	_, tokenHash, err := NewToken()
	require.NoError(t, err)
	file := "# disbatch-web credentials\n" +
		"\n" +
		"   # an indented comment\n" +
		"user alice read " + pw + "\n" +
		"user\tbob.smith@example.com\tWRITE\t" + pw + "   \r\n" +
		"token ci-bot admin " + tokenHash + "\n" +
		"token legacy_token write " + pw // no final newline
	users, err := Parse(strings.NewReader(file))
	require.NoError(t, err)
	require.Equal(t, 4, users.Len())
	require.Equal(t, RoleRead, users.byName["alice"].role)
	require.Equal(t, RoleWrite, users.byName["bob.smith@example.com"].role)
	require.Equal(t, RoleAdmin, users.byName["ci-bot"].role)
	require.Len(t, users.tokens, 2)
	require.Equal(t, MinIterations, users.dummy.iter, "unknown users cost the dearest entry")
}

func TestParseBadFiles(t *testing.T) {
	t.Parallel()
	pw := cheapHash(t, "pw")
	_, tokenHash, err := NewToken()
	require.NoError(t, err)
	const secret = "Tr0ub4dor&3"
	good := "# ok\nuser alice read " + pw + "\n"

	for _, tc := range []struct {
		name, file, want string
	}{
		{"empty", "", "no user or token lines"},
		{"only comments", "# nobody\n\n", "no user or token lines"},
		{"too few fields", good + "user bob write\n", `line 3: want 4 fields "KIND NAME ROLE HASH", got 3`},
		{"too many fields", good + "user bob write " + pw + " extra\n", "line 3: want 4 fields"},
		{"plaintext password with spaces", good + "user bob write my " + secret + "\n", "line 3: want 4 fields"},
		{"unknown kind", good + "group bob write " + pw + "\n", "line 3: unknown kind: want user or token"},
		{"unknown role", good + "user bob superuser " + pw + "\n", `line 3: user "bob": unknown role: want read, write or admin`},
		{"secret in the role column", good + "user bob " + secret + " " + pw + "\n", `line 3: user "bob": unknown role`},
		{"bad name", good + "user b/ob write " + pw + "\n", `line 3: name "b/ob"`},
		{"name starting with punctuation", good + "user -bob write " + pw + "\n", `line 3: name "-bob"`},
		{"name too long", good + "user " + strings.Repeat("b", 65) + " write " + pw + "\n", "line 3: name"},
		{"duplicate user", good + "user alice write " + pw + "\n", `line 3: duplicate name "alice" (first on line 2)`},
		{"duplicate across kinds", good + "token alice read " + tokenHash + "\n", `line 3: duplicate name "alice" (first on line 2)`},
		{"plaintext password as hash", good + "user bob write " + secret + "\n", `line 3: hash of user "bob": want "pbkdf2-sha256$ITERATIONS$SALT$KEY"`},
		{"unknown scheme", good + "user bob write md5$" + secret + "\n", `line 3: hash of user "bob": want`},
		{"pbkdf2 missing field", good + "user bob write pbkdf2-sha256$1000$c2FsdHNhbHQ\n", `line 3: hash of user "bob": pbkdf2-sha256: wrong number of $-separated fields`},
		{"pbkdf2 bad iterations", good + "user bob write " + strings.Replace(pw, "$1000$", "$many$", 1) + "\n", "line 3: hash of user \"bob\": pbkdf2-sha256: iterations must be a number in [1000, 10000000]"},
		{"pbkdf2 too few iterations", good + "user bob write " + strings.Replace(pw, "$1000$", "$10$", 1) + "\n", "line 3: hash of user \"bob\": pbkdf2-sha256: iterations"},
		{"pbkdf2 bad salt", good + "user bob write pbkdf2-sha256$1000$!!$" + strings.Split(pw, "$")[3] + "\n", "line 3: hash of user \"bob\": pbkdf2-sha256: the salt must be 8 to 64 bytes in base64"},
		{"pbkdf2 short salt", good + "user bob write pbkdf2-sha256$1000$c2FsdA$" + strings.Split(pw, "$")[3] + "\n", "the salt must be 8 to 64 bytes"},
		{"pbkdf2 bad key", good + "user bob write " + strings.Join(strings.Split(pw, "$")[:3], "$") + "$" + secret + "\n", "line 3: hash of user \"bob\": pbkdf2-sha256: the key is not base64"},
		{"pbkdf2 short key", good + "user bob write " + strings.Join(strings.Split(pw, "$")[:3], "$") + "$c2hvcnQ\n", "the key must be 16 to 64 bytes"},
		{"sha256 for a password", good + "user bob write " + tokenHash + "\n", `line 3: hash of user "bob": a password needs pbkdf2-sha256`},
		{"sha256 short digest", good + "token bob write " + strings.Join(strings.Split(tokenHash, "$")[:2], "$") + "$c2hvcnQ\n", "line 3: hash of token \"bob\": sha256: the digest must be 32 bytes"},
		{"sha256 extra field", good + "token bob write " + tokenHash + "$x\n", "line 3: hash of token \"bob\": sha256: wrong number"},
		{"line too long", good + "user bob write " + strings.Repeat("x", maxLineLen) + "\n", "line 3: longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(strings.NewReader(tc.file))
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), secret, "errors never quote a secret")
			require.NotContains(t, err.Error(), strings.Split(pw, "$")[3], "errors never quote a hash")
		})
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "credentials")
	require.NoError(t, os.WriteFile(path, []byte(Line(KindUser, "alice", RoleAdmin, cheapHash(t, "pw"))+"\n"), 0o600))
	users, err := LoadFile(path)
	require.NoError(t, err)
	require.Equal(t, 1, users.Len())
	p, err := users.Authenticate(basicRequest("alice", "pw"))
	require.NoError(t, err)
	require.Equal(t, RoleAdmin, p.Role)

	bad := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(bad, []byte("# x\nuser alice root nothash\n"), 0o600))
	_, err = LoadFile(bad)
	require.ErrorContains(t, err, "load credentials file "+bad+": line 2: ")

	_, err = LoadFile(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestLineRoundTrip(t *testing.T) {
	t.Parallel()
	h := cheapHash(t, "pw")
	line := Line(KindUser, "alice", RoleWrite, h)
	require.Equal(t, "user alice write "+h, line)
	e, ok, err := parseLine(line)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "alice", e.name)
	require.Equal(t, RoleWrite, e.role)
	require.Equal(t, h, e.hash.String())
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "alice", "ci-bot", "bob.smith@example.com", "x_1", strings.Repeat("n", 64)} {
		require.NoError(t, CheckName(ok), ok)
	}
	for _, bad := range []string{"", "al ice", "al:ice", "-x", ".x", "é", "a#b", strings.Repeat("n", 65)} {
		require.Error(t, CheckName(bad), bad)
	}
}
