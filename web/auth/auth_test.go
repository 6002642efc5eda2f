package auth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/clock"
)

// Passwords of the test file.
const (
	alicePassword = "correct horse battery staple"
	bobPassword   = "hunter2hunter2"
	carolPassword = "s3cret-admin"
)

type bundle struct {
	users *Users
	token string // ci-bot's bearer token (read)
	clock *clock.Fake
}

// setup parses a file with alice (read), bob (write), carol (admin) and the
// token ci-bot (read), hashed cheaply, with a fake clock for the cache.
func setup(t *testing.T) bundle {
	t.Helper()
	token, tokenHash, err := NewToken()
	require.NoError(t, err)
	file := strings.Join([]string{
		"# test credentials",
		Line(KindUser, "alice", RoleRead, cheapHash(t, alicePassword)),
		Line(KindUser, "bob", RoleWrite, cheapHash(t, bobPassword)),
		"",
		Line(KindUser, "carol", RoleAdmin, cheapHash(t, carolPassword)),
		Line(KindToken, "ci-bot", RoleRead, tokenHash),
	}, "\n")
	users, err := Parse(strings.NewReader(file))
	require.NoError(t, err)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return bundle{users: users.WithOptions(Options{Now: fake.Now}), token: token, clock: fake}
}

func cheapHash(t *testing.T, password string) string {
	t.Helper()
	h, err := HashPasswordWithIterations(password, MinIterations)
	require.NoError(t, err)
	return h
}

func basicRequest(user, password string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/queues", nil)
	r.SetBasicAuth(user, password)
	return r
}

func bearerRequest(token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/queues", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func TestAuthenticateBasic(t *testing.T) {
	t.Parallel()
	b := setup(t)

	p, err := b.users.Authenticate(basicRequest("bob", bobPassword))
	require.NoError(t, err)
	require.Equal(t, Principal{Name: "bob", Role: RoleWrite, Method: MethodBasic}, p)

	_, err = b.users.Authenticate(basicRequest("bob", bobPassword+"x"))
	require.ErrorIs(t, err, ErrBadCredentials)
	_, err = b.users.Authenticate(basicRequest("bob", ""))
	require.ErrorIs(t, err, ErrBadCredentials)
	_, err = b.users.Authenticate(basicRequest("bob", alicePassword)) // another user's password
	require.ErrorIs(t, err, ErrBadCredentials)
	_, err = b.users.Authenticate(basicRequest("Bob", bobPassword)) // names are case-sensitive
	require.ErrorIs(t, err, ErrBadCredentials)
	_, err = b.users.Authenticate(basicRequest("", ""))
	require.ErrorIs(t, err, ErrBadCredentials)
	_, err = b.users.Authenticate(basicRequest("bob", strings.Repeat("x", maxSecretLen+1)))
	require.ErrorIs(t, err, ErrBadCredentials)
}

func TestAuthenticateUnknownUserCostsADerivation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.users.derivations.Load()
	_, err := b.users.Authenticate(basicRequest("mallory", bobPassword))
	require.ErrorIs(t, err, ErrBadCredentials)
	require.Equal(t, before+1, b.users.derivations.Load(), "an unknown user must cost what a wrong password costs")
}

func TestAuthenticateNoOrMalformedCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.users.Authenticate(httptest.NewRequest(http.MethodGet, "/queues", nil))
	require.ErrorIs(t, err, ErrNoCredentials)

	for _, h := range []string{"Basic", "Basic !!!notbase64", "Basic Ym9i" /* "bob", no colon */, "Bearer", "Bearer   ", "Digest username=bob", "bob:hunter2"} {
		r := httptest.NewRequest(http.MethodGet, "/queues", nil)
		r.Header.Set("Authorization", h)
		_, err := b.users.Authenticate(r)
		require.ErrorIs(t, err, ErrBadCredentials, h)
		require.NotErrorIs(t, err, ErrNoCredentials, h)
	}
}

func TestAuthenticateBearer(t *testing.T) {
	t.Parallel()
	b := setup(t)

	p, err := b.users.Authenticate(bearerRequest(b.token))
	require.NoError(t, err)
	require.Equal(t, Principal{Name: "ci-bot", Role: RoleRead, Method: MethodBearer}, p)

	r := bearerRequest(b.token)
	r.Header.Set("Authorization", "bearer  "+b.token) // the scheme is case-insensitive
	_, err = b.users.Authenticate(r)
	require.NoError(t, err)

	for _, tok := range []string{b.token[:len(b.token)-1], b.token + "x", "dbt_" + strings.Repeat("A", 43), bobPassword, strings.Repeat("x", maxSecretLen+1)} {
		_, err := b.users.Authenticate(bearerRequest(tok))
		require.ErrorIs(t, err, ErrBadCredentials)
	}
	// A user's password is not a bearer token.
	_, err = b.users.Authenticate(bearerRequest(alicePassword))
	require.ErrorIs(t, err, ErrBadCredentials)
}

func TestAuthenticateTokenThroughBasic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, err := b.users.Authenticate(basicRequest("ci-bot", b.token))
	require.NoError(t, err)
	require.Equal(t, Principal{Name: "ci-bot", Role: RoleRead, Method: MethodBasic}, p)
	_, err = b.users.Authenticate(basicRequest("alice", b.token))
	require.ErrorIs(t, err, ErrBadCredentials)
}

func TestAuthenticatePBKDF2Token(t *testing.T) {
	t.Parallel()
	const token = "an-operator-made-token-of-enough-length-0123456789"
	users, err := Parse(strings.NewReader(Line(KindToken, "legacy", RoleWrite, cheapHash(t, token)) + "\n" +
		Line(KindUser, "alice", RoleRead, cheapHash(t, alicePassword))))
	require.NoError(t, err)
	p, err := users.Authenticate(bearerRequest(token))
	require.NoError(t, err)
	require.Equal(t, Principal{Name: "legacy", Role: RoleWrite, Method: MethodBearer}, p)
	_, err = users.Authenticate(bearerRequest(token + "x"))
	require.ErrorIs(t, err, ErrBadCredentials)
}

func TestCacheSkipsTheDerivationOfACorrectPassword(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.users.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
	derived := b.users.derivations.Load()
	for range 10 {
		p, err := b.users.Authenticate(basicRequest("alice", alicePassword))
		require.NoError(t, err)
		require.Equal(t, "alice", p.Name)
	}
	require.Equal(t, derived, b.users.derivations.Load(), "a remembered password is not derived again")
}

func TestCacheNeverPassesAWrongPassword(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.users.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
	before := b.users.derivations.Load()
	for _, pw := range []string{alicePassword + " ", "Correct horse battery staple", "", bobPassword} {
		_, err = b.users.Authenticate(basicRequest("alice", pw))
		require.ErrorIs(t, err, ErrBadCredentials)
	}
	// The right password of another name is not alice's either.
	_, err = b.users.Authenticate(basicRequest("bob", alicePassword))
	require.ErrorIs(t, err, ErrBadCredentials)
	require.Equal(t, before+5, b.users.derivations.Load(), "every wrong password is derived in full")

	// Failures are not remembered: the same wrong password costs again.
	_, err = b.users.Authenticate(basicRequest("alice", "wrong"))
	require.ErrorIs(t, err, ErrBadCredentials)
	_, err = b.users.Authenticate(basicRequest("alice", "wrong"))
	require.ErrorIs(t, err, ErrBadCredentials)
	require.Equal(t, before+7, b.users.derivations.Load())
	require.Equal(t, 1, b.users.cache.len())
}

func TestCacheEntriesExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.users.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
	derived := b.users.derivations.Load()

	b.clock.Advance(DefaultCacheTTL - time.Second)
	_, err = b.users.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
	require.Equal(t, derived, b.users.derivations.Load())

	b.clock.Advance(time.Second)
	_, err = b.users.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
	require.Equal(t, derived+1, b.users.derivations.Load(), "an expired entry is derived again")
}

func TestCacheIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	users := b.users.WithOptions(Options{CacheSize: 2, Now: b.clock.Now})

	for _, c := range [][2]string{{"alice", alicePassword}, {"bob", bobPassword}, {"carol", carolPassword}} {
		_, err := users.Authenticate(basicRequest(c[0], c[1]))
		require.NoError(t, err)
	}
	require.Equal(t, 2, users.cache.len())
	derived := users.derivations.Load()
	_, err := users.Authenticate(basicRequest("carol", carolPassword)) // newest: remembered
	require.NoError(t, err)
	require.Equal(t, derived, users.derivations.Load())
	_, err = users.Authenticate(basicRequest("alice", alicePassword)) // oldest: evicted
	require.NoError(t, err)
	require.Equal(t, derived+1, users.derivations.Load())
	require.Equal(t, 2, users.cache.len())
}

func TestCacheOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, o := range []Options{{CacheSize: -1}, {CacheTTL: -1}} {
		users := b.users.WithOptions(o)
		require.Nil(t, users.cache)
		for range 2 {
			_, err := users.Authenticate(basicRequest("alice", alicePassword))
			require.NoError(t, err)
		}
		require.Equal(t, int64(2), users.derivations.Load())
	}
}

func TestCacheHoldsNoSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.users.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
	_, err = b.users.Authenticate(bearerRequest(b.token))
	require.NoError(t, err)
	b.users.cache.mu.Lock()
	defer b.users.cache.mu.Unlock()
	for el := b.users.cache.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*cached)
		require.NotContains(t, string(e.key[:]), "alice")
		require.NotEqual(t, b.users.key('b', "alice", "x"), e.key)
	}
	// Two Users of the same file do not share cache keys.
	other := b.users.WithOptions(Options{})
	require.NotEqual(t, b.users.key('b', "alice", alicePassword), other.key('b', "alice", alicePassword))
	// The name is length-prefixed: moving bytes between name and secret changes the key.
	require.NotEqual(t, b.users.key('b', "ab", "c"), b.users.key('b', "a", "bc"))
}

func TestConcurrentAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := make(chan error)
	for i := range 16 {
		go func() {
			var err error
			if i%2 == 0 {
				_, err = b.users.Authenticate(basicRequest("bob", bobPassword))
			} else {
				_, err = b.users.Authenticate(bearerRequest(b.token))
			}
			done <- err
		}()
	}
	for range 16 {
		require.NoError(t, <-done)
	}
}
