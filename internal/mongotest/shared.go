package mongotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

// howTo tells a developer how to give the tests a MongoDB.
const howTo = "run `make mongod` (or set DISBATCH_MONGOD to a mongod binary, or MONGODB_URI to a replica set)"

// sharedStartTimeout bounds the start of the shared deployment (a container
// start may have to pull the image).
const sharedStartTimeout = 5 * time.Minute

// tryContainer enables the Docker fallback; this package's tests turn it off
// to check the failure message.
var tryContainer = true

// shared is the test binary's shared deployment.
var shared struct {
	mu      sync.Mutex
	tried   bool         // a start was attempted; uri/err hold its outcome
	uri     string       // set when the start succeeded
	err     error        // set when it failed; reported to every caller
	stop    func() error // stops what was started; nil if nothing was
	client  *mongo.Client
	dbCount atomic.Int64
}

// Main is used from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }
//
// It runs the tests and stops the shared deployment (if one was started)
// afterwards. A failure to stop it is printed and makes the result non-zero.
func Main(m *testing.M) int {
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "mongotest: stopping the shared MongoDB: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// URI returns the shared deployment's connection string, starting the
// deployment on first use (see the package doc for where it comes from). If
// none can be had, it calls t.Fatal with a message that says how to get one;
// a failed start is not retried, every caller gets its error.
func URI(t testing.TB) string {
	t.Helper()
	uri, err := sharedURI()
	if err != nil {
		t.Fatal(err)
	}
	return uri
}

// Client returns a client connected to URI, shared by all tests of the test
// binary (Main disconnects it). Tests must not Disconnect it.
func Client(t testing.TB) *mongo.Client {
	t.Helper()
	uri := URI(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.client == nil {
		c, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Fatalf("mongotest: connect to %s: %v", uri, err)
		}
		shared.client = c
	}
	return shared.client
}

// Database returns a new database for this test, on Client(t), with a unique
// name derived from t.Name() ("t_" + the name with every byte outside
// [A-Za-z0-9_] replaced by '_', shortened, plus a counter and random suffix;
// at most 60 bytes). It is dropped in t.Cleanup.
func Database(t testing.TB) *mongo.Database {
	t.Helper()
	db := Client(t).Database(databaseName(t.Name()))
	t.Cleanup(func() {
		// A drop waits for the majority; on a loaded three-member set one
		// timed out after 30 s (a CI dry run) though the test had passed.
		// dropDatabase is idempotent: try again before failing the test.
		var err error
		for attempt := 1; attempt <= 3; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = db.Drop(ctx)
			cancel()
			if err == nil {
				return
			}
			t.Logf("mongotest: drop database %s, attempt %d of 3: %v", db.Name(), attempt, err)
		}
		t.Errorf("mongotest: drop database %s: %v", db.Name(), err)
	})
	return db
}

// maxDatabaseName is the longest name Database returns (MongoDB allows 63).
const maxDatabaseName = 60

// databaseName makes a unique database name from a test name.
func databaseName(testName string) string {
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	// The random part keeps names unique across test binaries that share
	// one MONGODB_URI deployment; the counter within this one.
	suffix := "_" + strconv.FormatInt(shared.dbCount.Add(1), 10) + "_" + hex.EncodeToString(rnd[:])
	base := "t_" + strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, testName)
	// strings.Map maps every invalid UTF-8 byte and every non-ASCII rune to
	// one '_', so base is ASCII and can be cut anywhere.
	if limit := maxDatabaseName - len(suffix); len(base) > limit {
		base = base[:limit]
	}
	return base + suffix
}

// sharedURI starts the shared deployment once and returns its outcome.
func sharedURI() (string, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.tried {
		shared.tried = true
		shared.uri, shared.stop, shared.err = startShared()
	}
	return shared.uri, shared.err
}

// startShared gets a deployment from the first source that has one.
func startShared() (uri string, stop func() error, err error) {
	if uri := os.Getenv("MONGODB_URI"); uri != "" {
		return uri, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
	defer cancel()

	bin, binErr := mongod.Binary()
	if binErr == nil {
		rs, err := mongod.StartReplicaSet(ctx, mongod.Options{Binary: bin})
		if err != nil {
			return "", nil, fmt.Errorf("mongotest: could not start %s as a replica set "+
				"(set DISBATCH_MONGOD to another mongod binary, or MONGODB_URI to a replica set): %w", bin, err)
		}
		return rs.URI(), rs.Stop, nil
	}

	var cerr error = errContainerDisabled
	if tryContainer {
		uri, stop, cerr = startContainer(ctx)
	}
	if cerr != nil {
		return "", nil, fmt.Errorf("mongotest: no MongoDB for the tests: %s.\n"+
			"Tried, in order: MONGODB_URI (unset); a mongod binary: %v; a Docker container: %v",
			howTo, binErr, cerr)
	}
	return uri, stop, nil
}

var errContainerDisabled = errors.New("disabled")

// stopShared disconnects the shared client and stops the shared deployment.
func stopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	var errs []error
	if shared.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := shared.client.Disconnect(ctx); err != nil {
			errs = append(errs, fmt.Errorf("disconnect: %w", err))
		}
		shared.client = nil
	}
	if shared.stop != nil {
		errs = append(errs, shared.stop())
		shared.stop = nil
	}
	return errors.Join(errs...)
}

// ClientGoroutines are goleak options for the goroutines of the shared
// client (its server monitors), which may start during a test and outlive
// it by design: a goleak check of the test's own goroutines ignores them.
func ClientGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology.(*rttMonitor).runHellos"),
		goleak.IgnoreAnyFunction("go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology.checkServerWithSignal.func1"),
		goleak.IgnoreTopFunction("go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology.(*contextDoneListener).Listen"),
	}
}

// ChangeStreamCursors lists the change stream cursors on db's namespace
// that the server keeps open: idle ones and those in a getMore. A reader
// that stopped cleanly leaves none.
func ChangeStreamCursors(t testing.TB, db *mongo.Database) []bson.Raw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := db.Client().Database("admin").Aggregate(ctx, mongo.Pipeline{
		{{Key: "$currentOp", Value: bson.D{{Key: "idleCursors", Value: true}, {Key: "allUsers", Value: true}}}},
		{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "type", Value: "idleCursor"}, {Key: "ns", Value: db.Name() + ".$cmd.aggregate"}},
			bson.D{{Key: "ns", Value: db.Name() + ".$cmd"}, {Key: "command.getMore", Value: bson.D{{Key: "$exists", Value: true}}},
				{Key: "command.collection", Value: "$cmd.aggregate"}},
		}}}}},
	})
	if err != nil {
		t.Fatalf("mongotest: $currentOp: %v", err)
	}
	var out []bson.Raw
	if err := cur.All(ctx, &out); err != nil {
		t.Fatalf("mongotest: $currentOp: %v", err)
	}
	return out
}
