package store_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/store"
)

func TestRedactURI(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"mongodb://alice:s3cret@h1,h2/?replicaSet=rs0": "mongodb://alice:xxxxx@h1,h2/?replicaSet=rs0",
		"mongodb+srv://bob:p%40ss@cluster/db":          "mongodb+srv://bob:xxxxx@cluster/db",
		"mongodb://127.0.0.1:27017/?replicaSet=rs0":    "mongodb://127.0.0.1:27017/?replicaSet=rs0",
		"mongodb://onlyuser@h/":                        "mongodb://onlyuser@h/",
	} {
		require.Equal(t, want, store.RedactURI(in))
	}
}

func TestConnectAnswersWhatTheServerIs(t *testing.T) {
	t.Parallel()
	conn, err := store.Connect(context.Background(), store.ConnectParams{URI: mongotest.URI(t), Database: "connect_test"})
	require.NoError(t, err)
	defer conn.Close()
	require.NotEmpty(t, conn.ReplicaSet, "the test deployment is a replica set")
	require.NotNil(t, conn.Store)
}

func TestConnectErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	_, err := store.Connect(context.Background(), store.ConnectParams{URI: "mongodb://alice:s3cret@localhost/?authMechanism=BOGUS"})
	var ue *store.URIError
	require.ErrorAs(t, err, &ue)
	require.NotContains(t, err.Error(), "s3cret")
	require.Contains(t, err.Error(), "alice:xxxxx@")

	_, err = store.Connect(context.Background(), store.ConnectParams{URI: "mongodb://alice:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200"})
	var un *store.UnreachableError
	require.ErrorAs(t, err, &un)
	require.NotContains(t, err.Error(), "s3cret")
	require.Contains(t, err.Error(), "cannot reach MongoDB at mongodb://alice:xxxxx@127.0.0.1:1/")
}

// TestConnectDoesNotRetryWhatNoRetryMends: refused credentials and a TLS
// file that is not there fail at once, with Retry too (a daemon would
// otherwise retry them for ever, logging "cannot connect"), and say what
// they are.
func TestConnectDoesNotRetryWhatNoRetryMends(t *testing.T) {
	t.Parallel()
	uri := mongotest.URI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bad := strings.Replace(uri, "mongodb://", "mongodb://bob:wrongpassword@", 1)
	_, err := store.Connect(ctx, store.ConnectParams{URI: bad, Database: "d", Retry: true})
	var ae *store.AuthError
	require.ErrorAs(t, err, &ae, "%v", err)
	require.Contains(t, err.Error(), "refused the credentials")
	require.Contains(t, err.Error(), "AuthenticationFailed")
	require.NotContains(t, err.Error(), "wrongpassword")

	sep := "?"
	if strings.Contains(uri, "?") {
		sep = "&"
	}
	_, err = store.Connect(ctx, store.ConnectParams{URI: uri + sep + "tls=true&tlsCAFile=/nonexistent/ca.pem", Database: "d", Retry: true})
	var ue *store.URIError
	require.ErrorAs(t, err, &ue, "%v", err)
	require.Contains(t, err.Error(), "/nonexistent/ca.pem")
	require.NoError(t, ctx.Err(), "retried")
}

// TestConnectErrorsKeepTheirWordsWithAShortPassword: a short password is
// hidden where it is (the URI's userinfo), not replaced inside every word
// of the error that happens to hold its letters.
func TestConnectErrorsKeepTheirWordsWithAShortPassword(t *testing.T) {
	t.Parallel()
	_, err := store.Connect(context.Background(), store.ConnectParams{URI: "mongodb://u:o@127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200", Database: "d"})
	var un *store.UnreachableError
	require.ErrorAs(t, err, &un)
	require.Contains(t, err.Error(), "cannot reach MongoDB at mongodb://u:xxxxx@127.0.0.1:1/")
	require.Contains(t, err.Error(), "selection", "the error's own words garbled: %v", err)
}

func TestConnectRetriesWithBackoffUntilTheContextEnds(t *testing.T) {
	t.Parallel()
	fake := clock.NewFake(time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := store.Connect(ctx, store.ConnectParams{URI: "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100&connectTimeoutMS=100", Retry: true, Clock: fake})
		done <- err
	}()
	// Each failed attempt waits on the clock: three attempts, three waits.
	for range 3 {
		require.NoError(t, fake.BlockUntil(ctx, 1))
		fake.Advance(time.Minute)
	}
	require.NoError(t, fake.BlockUntil(ctx, 1), "a fourth attempt failed and waits again")
	cancel()
	select {
	case err := <-done:
		require.True(t, errors.Is(err, context.Canceled), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Connect did not return when its context ended")
	}
}

// TestConnectErrorsSayWhatWentWrong: a server that cannot be reached is
// told apart by the driver's last error with each server (it cut them
// all down to "server selection error: context deadline exceeded").
func TestConnectErrorsSayWhatWentWrong(t *testing.T) {
	t.Parallel()
	uri := mongotest.URI(t)
	u, err := url.Parse(uri)
	require.NoError(t, err)
	host := u.Host
	for _, c := range []struct{ name, uri, want string }{
		{"closed port", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300", "(127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused)"},
		{"wrong replica set name", "mongodb://" + host + "/?replicaSet=wrong&serverSelectionTimeoutMS=300", "replica set"},
		{"TLS to a server without it", "mongodb://" + host + "/?tls=true&serverSelectionTimeoutMS=300", host + ": "},
	} {
		_, err := store.Connect(context.Background(), store.ConnectParams{URI: c.uri, Database: "d"})
		var un *store.UnreachableError
		require.ErrorAs(t, err, &un, c.name)
		require.Contains(t, err.Error(), c.want, c.name)
		t.Logf("%s: %v", c.name, err)
	}
}

// TestConnectWaitsAsLongAsTheURISays: a URI's serverSelectionTimeoutMS
// longer than ConnectTimeout bounds the first round trip (it was cut at
// ConnectTimeout plus a second: the driver's own timeout never came).
func TestConnectWaitsAsLongAsTheURISays(t *testing.T) {
	t.Parallel()
	start := time.Now()
	_, err := store.Connect(context.Background(), store.ConnectParams{URI: "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=7000", Database: "d"})
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 6500*time.Millisecond, "cut at ConnectTimeout plus a second: %v", err)
}
