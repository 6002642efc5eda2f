package auth

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPasswordChecksAreBoundedAtOnce: a password check (PBKDF2) waits for
// one of MaxDerivations slots, and a request that waits DerivationWait in
// vain is answered ErrBusy (503 with Retry-After), for a known and an
// unknown name alike: bad passwords, never cached, could otherwise take
// every core. What needs no derivation (a cached login, a bearer token)
// is not held up.
func TestPasswordChecksAreBoundedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, runtime.GOMAXPROCS(0), cap(b.users.slots), "one check per core by default")
	u := b.users.WithOptions(Options{MaxDerivations: 1, DerivationWait: 20 * time.Millisecond})
	_, err := u.Authenticate(basicRequest("bob", bobPassword))
	require.NoError(t, err, "cached from now on")

	u.slots <- struct{}{} // a check that runs
	derived := u.derivations.Load()
	start := time.Now()
	_, err = u.Authenticate(basicRequest("bob", bobPassword+"x"))
	require.ErrorIs(t, err, ErrBusy)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond, "it waited for a slot")
	_, err = u.Authenticate(basicRequest("nobody", "x"))
	require.ErrorIs(t, err, ErrBusy, "an unknown name is busy too: the answer must not tell names apart")
	require.Equal(t, derived, u.derivations.Load(), "no derivation ran beyond the slots")
	p, err := u.Authenticate(basicRequest("bob", bobPassword))
	require.NoError(t, err, "a cached login needs no slot")
	require.Equal(t, "bob", p.Name)
	_, err = u.Authenticate(bearerRequest(b.token))
	require.NoError(t, err, "a token's check is cheap")

	h := Middleware(u, nil, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, basicRequest("alice", alicePassword))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
	require.Contains(t, rec.Body.String(), "too many password checks at once")

	<-u.slots // that check ended
	_, err = u.Authenticate(basicRequest("alice", alicePassword))
	require.NoError(t, err)
}

// TestConcurrentLoginsShareOneCheck: requests with the same credentials
// at once (a restart's reconnecting tabs, parallel CLI runs) share one
// password check: each took a derivation and a slot of its own, and with
// few slots the later ones got 503.
func TestConcurrentLoginsShareOneCheck(t *testing.T) {
	t.Parallel()
	h, err := HashPasswordWithIterations("pw", 200_000) // long enough for the requests to meet
	require.NoError(t, err)
	users, err := Parse(strings.NewReader(Line(KindUser, "dave", RoleRead, h) + "\n"))
	require.NoError(t, err)
	u := users.WithOptions(Options{MaxDerivations: 1, DerivationWait: 10 * time.Millisecond})
	const n = 8
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			_, err := u.Authenticate(basicRequest("dave", "pw"))
			errs <- err
		}()
	}
	close(start)
	for range n {
		require.NoError(t, <-errs)
	}
	require.EqualValues(t, 1, u.derivations.Load(), "one derivation for all of them")
}
