package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/disbatch-go/disbatch/internal/clock"
)

// ConnectTimeout bounds how long one attempt waits for MongoDB before it
// says it cannot reach it (instead of the driver's 30 s), unless the URI
// sets serverSelectionTimeoutMS or connectTimeoutMS itself.
const ConnectTimeout = 5 * time.Second

// ConnectParams say how to reach MongoDB.
type ConnectParams struct {
	URI      string
	Database string
	Options  Options
	// Retry keeps trying with backoff (0.5 s growing to 15 s), logging
	// each failed attempt, until MongoDB answers or ctx ends: for daemons
	// that may start before their database. Without it, one attempt.
	Retry  bool
	Logger *slog.Logger
	Clock  clock.Clock // the backoff's waits (default real)
}

// Conn is an open connection: a Store over the database, and what the
// server is.
type Conn struct {
	Store *Store
	// ReplicaSet is the replica set's name; "" for a standalone mongod,
	// which has no change streams.
	ReplicaSet string
	client     *mongo.Client
}

// Close disconnects, waiting at most 5 s for operations in flight.
func (c *Conn) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.client.Disconnect(ctx)
}

// URIError is a connection string that cannot be parsed. Its text never
// holds the password.
type URIError struct {
	URI string // redacted
	Err error
}

func (e *URIError) Error() string {
	return fmt.Sprintf("%q is not a valid MongoDB connection string: %v", e.URI, e.Err)
}

// UnreachableError is a MongoDB that did not answer. Its text never holds
// the password.
type UnreachableError struct {
	URI   string // redacted
	Cause string
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach MongoDB at %s: %s", e.URI, e.Cause)
}

// AuthError is a MongoDB that refused the URI's credentials: retrying
// cannot help. Its text never holds the password.
type AuthError struct {
	URI   string // redacted
	Cause string
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("MongoDB at %s refused the credentials: %s", e.URI, e.Cause)
}

// Connect opens a client, checks that MongoDB answers, asks what it is,
// and returns a Store over the database. A URI that cannot be parsed, or
// whose options cannot be applied (a TLS file missing), is a *URIError at
// once, retried or not, and so are refused credentials (*AuthError); a
// MongoDB that does not answer is an *UnreachableError (without Retry) or
// another attempt (with it).
func Connect(ctx context.Context, p ConnectParams) (*Conn, error) {
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := clock.Or(p.Clock)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime, b.Clock = 500*time.Millisecond, 15*time.Second, 0, c
	for attempt := 1; ; attempt++ {
		conn, err := connectOnce(ctx, p)
		var ue *URIError
		var ae *AuthError
		if err == nil || errors.As(err, &ue) || errors.As(err, &ae) || !p.Retry {
			return conn, err
		}
		wait := b.NextBackOff()
		msg, _, _ := strings.Cut(err.Error(), "\n")
		log.Warn("cannot connect to MongoDB; retrying", "attempt", attempt, "uri", RedactURI(p.URI), "in", wait, "error", msg)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped before MongoDB answered: %w", ctx.Err())
		case <-c.After(wait):
		}
	}
}

func connectOnce(ctx context.Context, p ConnectParams) (*Conn, error) {
	cs, err := connstring.ParseAndValidate(p.URI)
	if err != nil {
		return nil, &URIError{URI: RedactURI(p.URI), Err: errors.New(scrub(err, p.URI))}
	}
	opts := options.Client().ApplyURI(p.URI)
	if !cs.ServerSelectionTimeoutSet {
		opts.SetServerSelectionTimeout(ConnectTimeout)
	}
	if !cs.ConnectTimeoutSet {
		opts.SetConnectTimeout(ConnectTimeout)
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		// No I/O yet: the options themselves (a TLS file that is not
		// there), which no retry mends.
		return nil, &URIError{URI: RedactURI(p.URI), Err: errors.New(scrub(err, p.URI))}
	}
	conn := &Conn{client: client}
	// The URI's own selection timeout, when longer, bounds the first
	// round trip too (it was cut at ConnectTimeout whatever the URI said).
	wait := ConnectTimeout
	if cs.ServerSelectionTimeoutSet {
		wait = max(wait, cs.ServerSelectionTimeout)
	}
	pctx, cancel := context.WithTimeout(ctx, wait+time.Second)
	defer cancel()
	if err := client.Ping(pctx, readpref.Primary()); err != nil {
		conn.Close()
		return nil, unreachable(p.URI, err)
	}
	var hello struct {
		SetName string `bson:"setName"`
	}
	if err := client.Database(p.Database).RunCommand(pctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		conn.Close()
		return nil, unreachable(p.URI, fmt.Errorf("ask MongoDB what it is: %w", err))
	}
	conn.ReplicaSet = hello.SetName
	conn.Store = New(client.Database(p.Database), p.Options)
	return conn, nil
}

func unreachable(uri string, err error) error {
	cause := scrub(err, uri)
	var se mongo.ServerError
	if errors.As(err, &se) && se.HasErrorCode(authenticationFailed) {
		return &AuthError{URI: RedactURI(uri), Cause: cause}
	}
	// The driver's server-selection errors are long; keep the gist: what
	// went wrong with each server it tried, which tells a wrong host, a
	// closed port, a wrong replica set name and a TLS mismatch apart.
	if i := strings.Index(cause, ", current topology:"); i > 0 {
		cause = cause[:i] + topologyGist(cause[i:])
	}
	return &UnreachableError{URI: RedactURI(uri), Cause: cause}
}

var lastError = regexp.MustCompile(`Addr: ([^,]+), Type: [^,]+(?:, [A-Za-z ]+: [^,]+)*?, Last error: (.*?) }`)

// topologyGist is the servers' last errors from the driver's topology
// description, or what an empty one means.
func topologyGist(topology string) string {
	var parts []string
	for _, m := range lastError.FindAllStringSubmatch(topology, 8) {
		part := m[1] + ": " + strings.TrimSpace(m[2])
		if !slices.Contains(parts, part) {
			parts = append(parts, part)
		}
	}
	switch {
	case len(parts) > 0:
		return " (" + strings.Join(parts, "; ") + ")"
	case strings.Contains(topology, "Servers: []"):
		return " (no server answered as a member of the replica set: is replicaSet= its name?)"
	}
	return ""
}

// authenticationFailed is MongoDB's AuthenticationFailed error code.
const authenticationFailed = 18

var userinfo = regexp.MustCompile(`^(mongodb(?:\+srv)?://)([^@/]*)@`)

// RedactURI hides the password of a MongoDB URI, for logs and errors.
func RedactURI(uri string) string {
	return userinfo.ReplaceAllStringFunc(uri, func(m string) string {
		parts := userinfo.FindStringSubmatch(m)
		user, _, hasPass := strings.Cut(parts[2], ":")
		if !hasPass {
			return m
		}
		return parts[1] + user + ":xxxxx@"
	})
}

// scrub removes the URI's password from an error text: the URI itself,
// and its userinfo, wherever they appear, and the password alone when it
// is long enough not to be found inside ordinary words (a password of a
// few letters, replaced everywhere, garbles the text and hides nothing).
func scrub(err error, uri string) string {
	s := strings.ReplaceAll(err.Error(), uri, RedactURI(uri))
	if m := userinfo.FindStringSubmatch(uri); m != nil {
		if user, pass, ok := strings.Cut(m[2], ":"); ok && pass != "" {
			s = strings.ReplaceAll(s, m[2]+"@", user+":xxxxx@")
			if len(pass) >= 6 {
				s = strings.ReplaceAll(s, pass, "xxxxx")
			}
		}
	}
	return s
}
