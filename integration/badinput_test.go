package integration

// Bad input (issue 8): malformed CLI input and malformed documents put
// straight into MongoDB. Each one must be named in an error or a log line
// (the field, the line, the value), and must change nothing else: a
// rejected command writes nothing, and a node keeps serving its good queues
// whatever lies beside them.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestBadInput(t *testing.T) {
	t.Parallel()
	t.Run("CLI", testBadCLIInput)
	t.Run("Documents", testBadDocuments)
}

// badKV is a bson.E (go vet wants keyed fields for the driver's type).
func badKV(key string, value any) bson.E { return bson.E{Key: key, Value: value} }

// badCtx is a context for one database call of these tests.
func badCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// badMajority returns db's collection name written with write concern
// majority, as a careful submitter does (change streams only see
// majority-committed writes).
func badMajority(db *mongo.Database, name string) *mongo.Collection {
	return db.Collection(name, options.Collection().SetWriteConcern(writeconcern.Majority()))
}

// ---------------------------------------------------------------- the CLI

// badCLICase is one invocation of disbatch or disbatchd that must be
// refused. Every case runs against the same database and must leave it
// exactly as it was.
type badCLICase struct {
	name  string
	bin   string   // disbatchBin when empty
	args  []string // after --mongo-uri and --database (unless noConn)
	stdin string
	// file, when set, is written to a temporary file whose path replaces
	// {file} in args and in stderr.
	file      string
	noConn    bool
	code      int
	stderr    []string // substrings of stderr
	notStderr string   // must not be in stderr
}

func testBadCLIInput(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	ctx := badCtx(t)

	// The fixture: a good queue with one queued task and one malformed
	// task, and a malformed queue.
	st := store.New(db, store.Options{})
	good, err := st.QueueCreate(ctx, store.QueueCreateParams{Name: "good", Constructor: demo, MaxThreads: new(1), Sort: schema.SortFIFO})
	require.NoError(t, err)
	_, err = st.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: good.ID, Parameters: []bson.Raw{badRaw(t, bson.D{badKV("commands", "a")})}})
	require.NoError(t, err)
	badTask := bson.NewObjectID()
	_, err = badMajority(db, "tasks").InsertOne(ctx, bson.D{badKV("_id", badTask), badKV("queue", good.ID), badKV("status", "done"), badKV("node", -1), badKV("parameters", bson.D{})})
	require.NoError(t, err)
	broken := bson.NewObjectID()
	_, err = badMajority(db, "queues").InsertOne(ctx, bson.D{badKV("_id", broken), badKV("name", "broken"), badKV("constructor", demo), badKV("maxthreads", "ten")})
	require.NoError(t, err)

	huge := `{"blob":"` + strings.Repeat("x", 17<<20) + `"}` + "\n"
	missingID := bson.NewObjectID().Hex()
	d := disbatchdBin
	cases := []badCLICase{
		// task submit: the input, line by line.
		{name: "submit/invalid JSON line", args: []string{"task", "submit", "good"}, stdin: "{\"commands\":\"a\"}\n{\"commands\": \"a\"\n{\"commands\":\"b\"}\n",
			code: 1, stderr: []string{"stdin: line 2: invalid JSON", "1 of 3 items in stdin are invalid; nothing was inserted"}},
		{name: "submit/array line", args: []string{"task", "submit", "good"}, stdin: "{\"commands\":\"a\"}\n[1,2]\n",
			code: 1, stderr: []string{"stdin: line 2: parameters must be a JSON object, got an array"}},
		{name: "submit/string line", args: []string{"task", "submit", "good"}, stdin: "\"a\"\n",
			code: 1, stderr: []string{"stdin: line 1: parameters must be a JSON object, got a string"}},
		{name: "submit/number line after blank lines", args: []string{"task", "submit", "good"}, stdin: "{\"a\":1}\n\n42\n",
			code: 1, stderr: []string{"stdin: line 3: parameters must be a JSON object, got a number"}},
		{name: "submit/null line", args: []string{"task", "submit", "good"}, stdin: "null\n",
			code: 1, stderr: []string{"stdin: line 1: parameters must be a JSON object, got null"}},
		{name: "submit/boolean line", args: []string{"task", "submit", "good"}, stdin: "{\"a\":1}\ntrue\n",
			code: 1, stderr: []string{"stdin: line 2: parameters must be a JSON object, got a boolean"}},
		{name: "submit/bad ObjectId in extended JSON", args: []string{"task", "submit", "good"}, stdin: "{\"ref\":{\"$oid\":\"not-an-id\"}}\n",
			code: 1, stderr: []string{"stdin: line 1: cannot convert to BSON: the provided hex string is not a valid ObjectID"}},
		{name: "submit/bad date in extended JSON", args: []string{"task", "submit", "good"}, stdin: "{\"a\":1}\n{\"when\":{\"$date\":\"tomorrow\"}}\n",
			code: 1, stderr: []string{"stdin: line 2: cannot convert to BSON"}},
		{name: "submit/huge parameters", args: []string{"task", "submit", "good"}, stdin: huge,
			code: 1, stderr: []string{"stdin: line 1: parameters are 17825808 bytes as BSON, over the 16711680 allowed"}},
		{name: "submit/array with a number", args: []string{"task", "submit", "good"}, stdin: "[\n{\"commands\":\"a\"},\n7\n]\n",
			code: 1, stderr: []string{"stdin: line 3: parameters must be a JSON object, got a number"}},
		{name: "submit/array not closed", args: []string{"task", "submit", "good"}, stdin: "[{\"commands\":\"a\"}\n",
			code: 1, stderr: []string{"the array is not closed"}},
		{name: "submit/broken array", args: []string{"task", "submit", "good"}, stdin: "[{\"commands\":\"a\"},\n{bad}]\n",
			code: 1, stderr: []string{"stdin: line 2: invalid JSON"}},
		{name: "submit/empty input", args: []string{"task", "submit", "good"}, stdin: "",
			code: 1, stderr: []string{"no tasks in stdin"}},
		{name: "submit/only blank lines", args: []string{"task", "submit", "good"}, stdin: "\n  \n\t\n",
			code: 1, stderr: []string{"no tasks in stdin"}},
		{name: "submit/skip-invalid with nothing valid", args: []string{"task", "submit", "good", "--skip-invalid"}, stdin: "42\n",
			code: 1, stderr: []string{"stdin: line 1: parameters must be a JSON object, got a number", "no tasks in stdin"}},
		{name: "submit/invalid line in a file", args: []string{"task", "submit", "good", "{file}"}, file: "{\"commands\":\"a\"}\nnot json\n",
			code: 1, stderr: []string{"{file}: line 2: invalid JSON"}},
		{name: "submit/missing file", args: []string{"task", "submit", "good", "/nonexistent/tasks.json"}, stdin: "{\"commands\":\"a\"}\n",
			code: 1, stderr: []string{"open input", "/nonexistent/tasks.json", "no such file"}},
		{name: "submit/unknown queue", args: []string{"task", "submit", "nosuchqueue"}, stdin: "{\"commands\":\"a\"}\n",
			code: 1, stderr: []string{`queue "nosuchqueue": not found`}},
		{name: "submit/unknown queue id", args: []string{"task", "submit", missingID}, stdin: "{\"commands\":\"a\"}\n",
			code: 1, stderr: []string{`queue "` + missingID + `": not found`}},
		{name: "submit/malformed queue", args: []string{"task", "submit", "broken"}, stdin: "{\"commands\":\"a\"}\n",
			code: 1, stderr: []string{`queues document ObjectId("` + broken.Hex() + `"): field "maxthreads": want an integer, got string "ten"`}},
		{name: "submit/batch-size 0", args: []string{"task", "submit", "good", "--batch-size", "0"}, stdin: "{\"commands\":\"a\"}\n",
			code: 2, stderr: []string{"--batch-size must be between 1 and 100000"}},
		{name: "submit/batch-size not a number", args: []string{"task", "submit", "good", "--batch-size", "lots"}, stdin: "{\"commands\":\"a\"}\n",
			code: 2, stderr: []string{`invalid argument "lots" for "--batch-size"`}},
		{name: "submit/parallel 65", args: []string{"task", "submit", "good", "--parallel", "65"}, stdin: "{\"commands\":\"a\"}\n",
			code: 2, stderr: []string{"--parallel must be between 1 and 64"}},
		{name: "submit/no queue", args: []string{"task", "submit"},
			code: 2, stderr: []string{"want QUEUE and optionally FILE"}},
		{name: "submit/too many arguments", args: []string{"task", "submit", "good", "a.json", "b.json"},
			code: 2, stderr: []string{"want QUEUE and optionally FILE"}},

		// queue create and set.
		{name: "queue create/no constructor", args: []string{"queue", "create", "q1"},
			code: 2, stderr: []string{"constructor is required"}},
		{name: "queue create/negative maxthreads", args: []string{"queue", "create", "q1", "--constructor", demo, "--maxthreads", "-1"},
			code: 2, stderr: []string{`maxthreads must be a non-negative integer (at most 2147483647) or null, got "-1"`}},
		{name: "queue create/maxthreads not a number", args: []string{"queue", "create", "q1", "--constructor", demo, "--maxthreads", "lots"},
			code: 2, stderr: []string{`maxthreads must be a non-negative integer (at most 2147483647) or null, got "lots"`}},
		{name: "queue create/huge maxthreads", args: []string{"queue", "create", "q1", "--constructor", demo, "--maxthreads", "3000000000"},
			code: 2, stderr: []string{`got "3000000000"`, "2147483647"}},
		{name: "queue create/bad sort", args: []string{"queue", "create", "q1", "--constructor", demo, "--sort", "random"},
			code: 2, stderr: []string{`sort must be fifo, lifo, priority or default, got "random"`}},
		{name: "queue create/name like an ObjectId", args: []string{"queue", "create", missingID, "--constructor", demo},
			code: 2, stderr: []string{`queue name "` + missingID + `" looks like an ObjectId`}},
		{name: "queue create/name with spaces", args: []string{"queue", "create", " q1 ", "--constructor", demo},
			code: 2, stderr: []string{`queue name " q1 " has leading or trailing white space`}},
		{name: "queue create/empty name", args: []string{"queue", "create", "", "--constructor", demo},
			code: 2, stderr: []string{"queue name is required"}},
		{name: "queue create/no name", args: []string{"queue", "create", "--constructor", demo},
			code: 2, stderr: []string{"want 1 argument(s) (NAME), got 0"}},
		{name: "queue create/name taken", args: []string{"queue", "create", "good", "--constructor", demo},
			code: 1, stderr: []string{`create queue "good": a queue with this name already exists`}},
		{name: "queue set/negative maxthreads", args: []string{"queue", "set", "good", "maxthreads=-3"},
			code: 2, stderr: []string{`maxthreads must be a non-negative integer (at most 2147483647) or null, got "-3"`}},
		{name: "queue set/huge maxthreads", args: []string{"queue", "set", "good", "threads=99999999999"},
			code: 2, stderr: []string{`got "99999999999"`, "2147483647"}},
		{name: "queue set/bad sort", args: []string{"queue", "set", "good", "sort=newest"},
			code: 2, stderr: []string{`sort must be fifo, lifo, priority or default, got "newest"`}},
		{name: "queue set/empty sort", args: []string{"queue", "set", "good", "sort="},
			code: 2, stderr: []string{`sort must be fifo, lifo, priority or default, got ""`}},
		{name: "queue set/unknown key", args: []string{"queue", "set", "good", "colour=blue"},
			code: 2, stderr: []string{`unknown key "colour"`}},
		{name: "queue set/not KEY=VALUE", args: []string{"queue", "set", "good", "maxthreads"},
			code: 2, stderr: []string{`"maxthreads" is not KEY=VALUE`}},
		{name: "queue set/key twice", args: []string{"queue", "set", "good", "maxthreads=1", "threads=2"},
			code: 2, stderr: []string{"maxthreads given twice"}},
		{name: "queue set/empty constructor", args: []string{"queue", "set", "good", "plugin= "},
			code: 2, stderr: []string{"constructor must not be empty"}},
		{name: "queue set/nothing to set", args: []string{"queue", "set", "good"},
			code: 2, stderr: []string{"want NAME and at least one KEY=VALUE"}},
		{name: "queue set/unknown queue", args: []string{"queue", "set", "nosuchqueue", "maxthreads=2"},
			code: 1, stderr: []string{`queue "nosuchqueue": not found`}},
		{name: "queue set/rename to a taken name", args: []string{"queue", "set", "good", "name=broken"},
			code: 1, stderr: []string{`rename to "broken": a queue with this name already exists`}},
		{name: "queue delete/unfinished tasks", args: []string{"queue", "delete", "good"},
			code: 1, stderr: []string{"has 1 unfinished tasks", "use --force"}},
		{name: "queue delete/unknown queue", args: []string{"queue", "delete", "nosuchqueue"},
			code: 1, stderr: []string{`queue "nosuchqueue": not found`}},

		// task show and list.
		{name: "task show/bad ObjectId", args: []string{"task", "show", "12345"},
			code: 2, stderr: []string{`task id "12345" is not an ObjectId (24 hex digits)`}},
		{name: "task show/unknown task", args: []string{"task", "show", missingID},
			code: 1, stderr: []string{"task " + missingID + ": not found"}},
		{name: "task show/malformed task", args: []string{"task", "show", badTask.Hex()},
			code: 1, stderr: []string{`tasks document ObjectId("` + badTask.Hex() + `"): field "status": want an integer, got string "done"`}},
		{name: "task list/unknown status", args: []string{"task", "list", "good", "--status", "finished"},
			code: 2, stderr: []string{`unknown status "finished"`}},
		{name: "task list/negative limit", args: []string{"task", "list", "good", "--limit", "-1"},
			code: 2, stderr: []string{"--limit must be >= 0"}},
		{name: "task list/unknown queue", args: []string{"task", "list", "nosuchqueue"},
			code: 1, stderr: []string{`queue "nosuchqueue": not found`}},
		{name: "task list/malformed task is named", args: []string{"task", "list", "good"},
			code: 0, stderr: []string{`warning: skipping tasks document ObjectId("` + badTask.Hex() + `"): field "status": want an integer, got string "done"`}},
		{name: "queue list/malformed queue is named", args: []string{"queue", "list"},
			code: 0, stderr: []string{`warning: skipping queues document ObjectId("` + broken.Hex() + `"): field "maxthreads": want an integer, got string "ten"`}},

		// Commands, flags, connection.
		{name: "unknown command", args: []string{"frobnicate"},
			code: 2, stderr: []string{`unknown command "frobnicate"`}},
		{name: "unknown subcommand", args: []string{"queue", "frobnicate"},
			code: 2, stderr: []string{`unknown command "frobnicate" for "disbatch queue"`}},
		{name: "unknown task subcommand", args: []string{"task", "delete", "x"},
			code: 2, stderr: []string{`unknown command "delete" for "disbatch task"`}},
		{name: "unknown flag", args: []string{"queue", "list", "--bogus"},
			code: 2, stderr: []string{"unknown flag: --bogus"}},
		{name: "invalid mongo-uri", args: []string{"--mongo-uri", "mongodb://localhost:notaport/", "queue", "list"}, noConn: true,
			code: 2, stderr: []string{`--mongo-uri "mongodb://localhost:notaport/" is not a valid MongoDB connection string`, `port must be an integer`}},
		{name: "invalid mongo-uri hides the password", args: []string{"--mongo-uri", "mongodb://alice:s3cret@localhost/?authMechanism=BOGUS", "queue", "list"}, noConn: true,
			code: 2, stderr: []string{`--mongo-uri "mongodb://alice:xxxxx@localhost/?authMechanism=BOGUS" is not a valid MongoDB connection string: error parsing uri: invalid auth mechanism`},
			notStderr: "s3cret"},
		{name: "mongo-uri without a scheme", args: []string{"--mongo-uri", "localhost:27017", "queue", "list"}, noConn: true,
			code: 2, stderr: []string{`--mongo-uri "localhost:27017" is not a valid MongoDB connection string`}},
		{name: "unreachable MongoDB", args: []string{"--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300&connectTimeoutMS=300", "queue", "list"}, noConn: true,
			code: 1, stderr: []string{"cannot reach MongoDB at mongodb://127.0.0.1:1/"}},

		// disbatchd: every refusal comes before it touches the database
		// (the connection flags point at this test's database, so a node
		// that started anyway would write its nodes document).
		{name: "disbatchd/negative maxthreads", bin: d, args: []string{"--node", "n", "--maxthreads", "-1"},
			code: 2, stderr: []string{`--maxthreads must be a non-negative integer, got "-1"`}},
		{name: "disbatchd/maxthreads not a number", bin: d, args: []string{"--node", "n", "--maxthreads", "eight"},
			code: 2, stderr: []string{`--maxthreads must be a non-negative integer, got "eight"`}},
		{name: "disbatchd/maxthreads overflows", bin: d, args: []string{"--node", "n", "--maxthreads", "99999999999999999999"},
			code: 2, stderr: []string{`--maxthreads must be a non-negative integer, got "99999999999999999999"`}},
		{name: "disbatchd/negative tick", bin: d, args: []string{"--node", "n", "--tick", "-1s"},
			code: 2, stderr: []string{`invalid argument "-1s" for "--tick" flag: must not be negative`}},
		{name: "disbatchd/grace not a duration", bin: d, args: []string{"--node", "n", "--grace", "soon"},
			code: 2, stderr: []string{`invalid argument "soon" for "--grace" flag`}},
		{name: "disbatchd/unknown built-in plugin", bin: d, args: []string{"--node", "n", "--enable-plugin", "python"},
			code: 2, stderr: []string{`--enable-plugin "python": the built-in plugins that can be enabled are exec and shell`}},
		{name: "disbatchd/plugin without a path", bin: d, args: []string{"--node", "n", "--plugin", "My::Plugin"},
			code: 2, stderr: []string{`--plugin "My::Plugin": want NAME=PATH`}},
		{name: "disbatchd/plugin path missing", bin: d, args: []string{"--node", "n", "--plugin", "My::Plugin=/nonexistent/plugin"},
			code: 2, stderr: []string{"plugin My::Plugin: stat /nonexistent/plugin: no such file or directory"}},
		{name: "disbatchd/plugin path is a directory", bin: d, args: []string{"--node", "n", "--plugin", "My::Plugin=" + os.TempDir()},
			code: 2, stderr: []string{"plugin My::Plugin: " + os.TempDir() + " is not an executable file"}},
		{name: "disbatchd/bad log format", bin: d, args: []string{"--node", "n", "--log-format", "xml"},
			code: 2, stderr: []string{`--log-format "xml": want text or json`}},
		{name: "disbatchd/bad log level", bin: d, args: []string{"--node", "n", "--log-level", "loud"},
			code: 2, stderr: []string{`--log-level "loud": want debug, info, warn or error`}},
		{name: "disbatchd/empty node name", bin: d, args: []string{"--node", ""},
			code: 2, stderr: []string{"no node name: give --node or DISBATCH_NODE"}},
		{name: "disbatchd/arguments", bin: d, args: []string{"--node", "n", "extra"},
			code: 2, stderr: []string{`disbatchd takes no arguments, got ["extra"]`}},
		{name: "disbatchd/bad metrics address", bin: d, args: []string{"--node", "n", "--metrics-addr", "localhost:http"},
			code: 2, stderr: []string{`metrics address "localhost:http": the port must be a number from 0 to 65535`}},
		{name: "disbatchd/invalid mongo-uri", bin: d, args: []string{"--node", "n", "--mongo-uri", "mongodb://localhost:99999/"}, noConn: true,
			code: 2, stderr: []string{`--mongo-uri "mongodb://localhost:99999/" is not a valid MongoDB connection string`, "port must be in the range [1, 65535]"}},
		{name: "disbatchd/unknown flag", bin: d, args: []string{"--node", "n", "--threads", "4"},
			code: 2, stderr: []string{"unknown flag: --threads"}},
		{name: "disbatchd/config file missing", bin: d, args: []string{"--node", "n", "--config", "/nonexistent/disbatchd.json"},
			code: 2, stderr: []string{"--config: open /nonexistent/disbatchd.json: no such file or directory"}},
		{name: "disbatchd/config not JSON", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: "node = n\n",
			code: 2, stderr: []string{"--config {file}: invalid character"}},
		{name: "disbatchd/config unknown key", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: `{"maxthread": 4}`,
			code: 2, stderr: []string{`--config {file}: json: unknown field "maxthread"`}},
		{name: "disbatchd/config maxthreads a string", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: `{"maxthreads": "4"}`,
			code: 2, stderr: []string{"--config {file}", "settings.maxthreads of type int"}},
		{name: "disbatchd/config negative maxthreads", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: `{"maxthreads": -3}`,
			code: 2, stderr: []string{`maxthreads must be a non-negative integer, got "-3"`}},
		{name: "disbatchd/config grace a number", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: `{"grace": 5}`,
			code: 2, stderr: []string{`--config {file}: want a duration such as "30s", got 5`}},
		{name: "disbatchd/config two objects", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: `{"node": "a"} {"node": "b"}`,
			code: 2, stderr: []string{"--config {file}: want one JSON object, found more after it"}},
		{name: "disbatchd/config enable_plugins unknown", bin: d, args: []string{"--node", "n", "--config", "{file}"}, file: `{"enable_plugins": ["sh"]}`,
			code: 2, stderr: []string{`--enable-plugin "sh": the built-in plugins that can be enabled are exec and shell`}},
	}

	before := badSnapshot(t, db)
	dir := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin := c.bin
			if bin == "" {
				bin = disbatchBin
			}
			args, want := slices.Clone(c.args), slices.Clone(c.stderr)
			if c.file != "" {
				path := filepath.Join(dir, fmt.Sprintf("input-%d.json", i))
				require.NoError(t, os.WriteFile(path, []byte(c.file), 0o600))
				for j := range args {
					args[j] = strings.ReplaceAll(args[j], "{file}", path)
				}
				for j := range want {
					want[j] = strings.ReplaceAll(want[j], "{file}", path)
				}
			}
			if !c.noConn {
				args = append([]string{"--mongo-uri", uri, "--database", db.Name()}, args...)
			}
			r := runBin(t, bin, c.stdin, nil, args...)
			show := func() string {
				return fmt.Sprintf("%s %s\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), r.stdout, r.stderr)
			}
			require.Equal(t, c.code, r.code, "exit code; %s", show())
			for _, s := range want {
				require.Contains(t, r.stderr, s, show())
			}
			require.NotContains(t, r.stderr, "panic", show())
			if c.notStderr != "" {
				require.NotContains(t, r.stderr, c.notStderr, show())
			}
			if c.code == 2 {
				require.Contains(t, r.stderr, "for usage.", "a usage error points at --help; %s", show())
			}
			if c.code != 0 {
				require.Empty(t, r.stdout, show())
			}
			require.Equal(t, before, badSnapshot(t, db), "the database changed; %s", show())
		})
	}
}

func badFmtPtr(p *int64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

func badRaw(t *testing.T, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	require.NoError(t, err)
	return b
}

// badSnapshot renders every collection of db (names, indexes and documents
// in _id order) as text, to show that nothing was written.
func badSnapshot(t *testing.T, db *mongo.Database) string {
	t.Helper()
	ctx := badCtx(t)
	names, err := db.ListCollectionNames(ctx, bson.D{})
	require.NoError(t, err)
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "collection %s\n", n)
		specs, err := db.Collection(n).Indexes().ListSpecifications(ctx)
		require.NoError(t, err)
		for _, s := range specs {
			fmt.Fprintf(&b, "  index %s %s\n", s.Name, s.KeysDocument)
		}
		cur, err := db.Collection(n).Find(ctx, bson.D{}, options.Find().SetSort(bson.D{badKV("_id", 1)}))
		require.NoError(t, err)
		for cur.Next(ctx) {
			fmt.Fprintf(&b, "  %s\n", cur.Current)
		}
		require.NoError(t, cur.Err())
		require.NoError(t, cur.Close(ctx))
	}
	return b.String()
}

// ------------------------------------------------------------ documents

// badFate is what a node does with a malformed task document.
type badFate int

const (
	fateUnchecked badFate = iota
	fateFailed            // status 2, stderr saying why
	fateSucceeded         // status 1: tolerated
	fateClaimed           // claimed (-1) by the node and left so: the reaper orphans it later
	fateUntouched         // left exactly as inserted
)

// badDocCase is one malformed document (or several) put into MongoDB while
// a node runs. In log, taskStderr and cliStderr, {id} stands for the hex
// _id of the first document, {qname} for the name e.queue gives it, {good}
// for the good queue's hex _id and {node} for the node's name.
type badDocCase struct {
	name string
	coll string // tasks, queues, config; nodes $sets the fields of doc on the node's own document
	docs func(e *badDocEnv) []bson.D
	// fate is what happens to the task (coll tasks) or, for a queue, to
	// a well-formed task put into it.
	fate       badFate
	taskStderr []string
	// log are substrings of one line of the node's log.
	log []string
	// cliArgs is a read-only disbatch command run afterwards; it must exit
	// 0 with cliStderr and cliStdout in its output.
	cliArgs   []string
	cliStderr []string
	cliStdout []string
}

type badDocEnv struct {
	db   *mongo.Database
	st   *store.Store
	uri  string
	node *proc
	name string        // the node's name
	good bson.ObjectID // the good queue
}

// task is a well-formed queued task of the good queue with changes: a field
// is set (or added), or removed when its value is badDrop{}.
func (e *badDocEnv) task(changes ...bson.E) bson.D {
	return badChanged(bson.D{
		badKV("_id", bson.NewObjectID()),
		badKV("queue", e.good),
		badKV("ctime", time.Now()),
		badKV("mtime", time.Now()),
		badKV("node", -1),
		badKV("status", -2),
		badKV("parameters", bson.D{badKV("commands", "a")}),
		badKV("stdout", nil),
		badKV("stderr", nil),
	}, changes)
}

// queue is a well-formed queue with changes (see task).
func (e *badDocEnv) queue(changes ...bson.E) bson.D {
	id := bson.NewObjectID()
	return badChanged(bson.D{
		badKV("_id", id),
		badKV("name", "q-"+id.Hex()[16:]), // {qname}
		badKV("constructor", demo),
		badKV("maxthreads", 1),
		badKV("sort", "fifo"),
	}, changes)
}

// badDrop as a value in badChanged removes the field.
type badDrop struct{}

// badChanged applies changes to d (see task).
func badChanged(d bson.D, changes []bson.E) bson.D {
	for _, c := range changes {
		i := slices.IndexFunc(d, func(e bson.E) bool { return e.Key == c.Key })
		switch {
		case i < 0:
			d = append(d, c)
		case c.Value == badDrop{}:
			d = slices.Delete(d, i, i+1)
		default:
			d[i] = c
		}
	}
	return d
}

// badOne makes a docs func of a single document.
func badOne(f func(e *badDocEnv) bson.D) func(e *badDocEnv) []bson.D {
	return func(e *badDocEnv) []bson.D { return []bson.D{f(e)} }
}

func testBadDocuments(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	ctx := badCtx(t)
	e := &badDocEnv{db: db, st: store.New(db, store.Options{}), uri: uri, name: "badinput"}
	good, err := e.st.QueueCreate(ctx, store.QueueCreateParams{Name: "good", Constructor: demo, MaxThreads: new(2), Sort: schema.SortFIFO})
	require.NoError(t, err)
	e.good = good.ID
	e.node = startNode(t, nodeArgs(uri, db.Name(), e.name, "--log-format", "json"))
	badWaitLog(t, e.node, startWait, "msg=node started")
	e.goodTaskRuns(t)

	big := strings.Repeat("x", 15<<20)
	cases := []badDocCase{
		// Tasks the node claims and fails, naming the field.
		{name: "task/parameters a string", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("parameters", "commands=a")) }),
			fate: fateFailed, taskStderr: []string{`disbatchd: malformed task document: tasks document ObjectId("{id}"): field "parameters": want an object, got string "commands=a"`},
			log: []string{"claimed a malformed task; failing it", "task_id={id}", `field "parameters"`}},
		{name: "task/parameters an array", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("parameters", bson.A{"a"})) }),
			fate: fateFailed, taskStderr: []string{`field "parameters": want an object, got array`}},
		{name: "task/parameters a number", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("parameters", 42)) }),
			fate: fateFailed, taskStderr: []string{`field "parameters": want an object, got 32-bit integer 42`}},
		{name: "task/legacy params a string", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D {
			return e.task(badKV("parameters", badDrop{}), badKV("params", "commands=a"))
		}),
			fate: fateFailed, taskStderr: []string{`field "params": want an object, got string "commands=a"`}},
		{name: "task/ctime a string", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("ctime", "yesterday")) }),
			fate: fateFailed, taskStderr: []string{`field "ctime": want a date, got string "yesterday"`}},
		{name: "task/stdout a number", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("stdout", 5)) }),
			fate: fateFailed, taskStderr: []string{`field "stdout": want a string, a GridFS ObjectId or null, got 32-bit integer 5`}},
		{name: "task/stderr an object", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("stderr", bson.D{badKV("text", "x")})) }),
			fate: fateFailed, taskStderr: []string{`field "stderr": want a string, a GridFS ObjectId or null, got object`}},
		// (commands a number is no bad input: Demo reads it as the digits
		// Perl prints, as 4.103's does; plugin's TestDemoOddCommandsAsPerl.)

		// Tasks the node cannot claim: left alone, named where they show.
		{name: "task/node a boolean", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("node", true)) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=node", "want a node name, -1 or null, got boolean true; no node will claim the task"},
			cliArgs: []string{"task", "list", "good"}, cliStderr: []string{`warning: skipping tasks document ObjectId("{id}"): field "node": want a node name, -1 or null, got boolean true`}},
		{name: "task/status a string", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", "-2")) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=status", `want a 32-bit integer status, got string "-2"; no node will claim the task`},
			cliArgs: []string{"task", "list", "good"}, cliStderr: []string{`ObjectId("{id}"): field "status": want an integer, got string "-2"`}},
		{name: "task/status a fraction", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", -2.5)) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=status", "want a 32-bit integer status, got double -2.5; no node will claim the task"},
			cliArgs: []string{"task", "list", "good"}, cliStderr: []string{`ObjectId("{id}"): field "status": want an integer, got -2.5`}},
		{name: "task/status beyond 32 bits", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", int64(1)<<40)) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=status", "want a 32-bit integer status, got 64-bit integer 1099511627776; no node will claim the task"},
			cliArgs: []string{"task", "list", "good"}, cliStderr: []string{`ObjectId("{id}"): field "status": want a 32-bit status code, got 64-bit integer 1099511627776`}},
		{name: "task/status missing", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", badDrop{})) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=status", "problem=missing; no node will claim the task"},
			cliArgs: []string{"task", "list", "good"}, cliStderr: []string{`ObjectId("{id}"): field "status": missing`}},
		{name: "task/unknown negative status", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", -7)) }),
			fate: fateUntouched, cliArgs: []string{"task", "list", "good", "--status", "-7"}, cliStdout: []string{"{id}  -7"}},
		{name: "task/unknown positive status", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", 42)) }),
			fate: fateUntouched, cliArgs: []string{"task", "list", "good", "--status", "42"}, cliStdout: []string{"{id}  42"}},
		{name: "task/queue a string", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("queue", e.good.Hex())) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=queue", `want an ObjectId, got string "{good}"; the task belongs to no queue and will never run`}},
		{name: "task/queue missing", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("queue", badDrop{})) }),
			fate: fateUntouched, log: []string{"msg=malformed document", "_id={id}", "field=queue", "problem=missing; the task belongs to no queue and will never run"}},
		{name: "task/queue an unknown id", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("queue", bson.NewObjectID())) }),
			fate: fateUntouched},

		// Tolerated: the task runs.
		{name: "task/status a whole double", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("status", -2.0)) }),
			fate: fateSucceeded},
		{name: "task/node null (Disbatch 4.103)", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D { return e.task(badKV("node", nil)) }),
			fate: fateSucceeded},
		{name: "task/huge parameters", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D {
			return e.task(badKV("parameters", bson.D{badKV("commands", "a"), badKV("blob", big)}))
		}),
			fate: fateSucceeded},

		// A task whose _id is not an ObjectId: claimed, named, and failed
		// by the _id it has.
		{name: "task/_id a string", coll: "tasks", docs: badOne(func(e *badDocEnv) bson.D {
			return e.task(badKV("_id", "bad-id-"+bson.NewObjectID().Hex()))
		}),
			fate: fateFailed, taskStderr: []string{`field "_id": want an ObjectId, got string "{id}"`},
			log: []string{"claimed a task whose _id is not an ObjectId; failing it", `field "_id": want an ObjectId, got string "{id}"`}},

		// Queues: named in the log, ignored, and their tasks left alone.
		{name: "queue/maxthreads a string", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("maxthreads", "ten")) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `queues document ObjectId("{id}"): field "maxthreads": want an integer, got string "ten"`}},
		{name: "queue/maxthreads negative", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("maxthreads", -1)) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "maxthreads": -1 is out of range`}},
		{name: "queue/maxthreads huge", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("maxthreads", int64(math.MaxInt32)+1)) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "maxthreads": 2147483648 is out of range`}},
		{name: "queue/maxthreads a fraction", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("maxthreads", 2.5)) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "maxthreads": want an integer, got 2.5`}},
		{name: "queue/legacy threads a string", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D {
			return e.queue(badKV("maxthreads", badDrop{}), badKV("threads", "many"))
		}),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "threads": want an integer, got string "many"`}},
		{name: "queue/name missing", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("name", badDrop{})) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "name": missing`}},
		{name: "queue/name a number", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("name", 7)) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "name": want a string, got 32-bit integer 7`}},
		{name: "queue/constructor missing", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("constructor", badDrop{})) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "constructor": missing`}},
		{name: "queue/constructor an array", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("constructor", bson.A{demo})) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "constructor": want a string, got array`}},
		{name: "queue/unknown constructor", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("constructor", "No::Such::Plugin")) }),
			fate: fateUntouched, log: []string{"msg=queue ignored", "queue={qname}", "reason=no plugin for constructor No::Such::Plugin on this node"}},
		{name: "queue/sort a number", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("sort", 1)) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "sort": want a string, got 32-bit integer 1`}},
		{name: "queue/nodes_pin a number", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("nodes_pin", 5)) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "nodes_pin": want an array of strings, got 32-bit integer 5`}},
		{name: "queue/nodes_ignore with a number", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("nodes_ignore", bson.A{"other", 5})) }),
			fate: fateUntouched, log: []string{"msg=malformed queue ignored", `ObjectId("{id}"): field "nodes_ignore.1": want a string, got 32-bit integer 5`}},
		{name: "queue/_id a string", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("_id", "queue-"+bson.NewObjectID().Hex())) }),
			log: []string{"msg=malformed queue ignored", `queues document string "{id}": field "_id": want an ObjectId, got string "{id}"`}},
		// Tolerated: an unknown sort is the default order; counters that
		// are not non-negative integers are recounted, and the queue is
		// served meanwhile (a counter is a projection, not an order).
		{name: "queue/unknown sort", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D { return e.queue(badKV("sort", "random")) }),
			fate: fateSucceeded, log: []string{"msg=queue", "queue={qname}", `reason=unknown sort "random": using the default order`}},
		{name: "queue/count_todo a string", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D {
			return e.queue(badKV("count_todo", "lots"), badKV("count_total", "many"))
		}),
			fate: fateSucceeded, log: []string{"msg=queue counters created by a recount", "queue={id}"}},
		{name: "queue/count_todo a fraction, count_running negative", coll: "queues", docs: badOne(func(e *badDocEnv) bson.D {
			return e.queue(badKV("count_todo", 2.5), badKV("count_total", 3), badKV("count_running", -1), badKV("count_failed", 0))
		}),
			fate: fateSucceeded, log: []string{"msg=queue counters created by a recount", "queue={id}"}},

		// The config document: a malformed one is named and ignored (the
		// node runs as without one).
		{name: "config/activequeues a number", coll: "config", docs: badOne(func(e *badDocEnv) bson.D {
			return bson.D{badKV("_id", bson.NewObjectID()), badKV("active", true), badKV("activequeues", 5)}
		}),
			log: []string{"msg=config", `reason=config document ObjectId("{id}"): field "activequeues": want an array of strings, got 32-bit integer 5`}},
		{name: "config/ignorequeues with an object", coll: "config", docs: badOne(func(e *badDocEnv) bson.D {
			return bson.D{badKV("_id", bson.NewObjectID()), badKV("active", true), badKV("ignorequeues", bson.A{"other", bson.D{badKV("name", "good")}})}
		}),
			log: []string{"msg=config", `reason=config document ObjectId("{id}"): field "ignorequeues.1": want a string, got object`}},
		{name: "config/two active documents", coll: "config", docs: func(e *badDocEnv) []bson.D {
			return []bson.D{
				{badKV("_id", bson.NewObjectID()), badKV("active", true), badKV("activequeues", bson.A{"other"})},
				{badKV("_id", bson.NewObjectID()), badKV("active", true)},
			}
		},
			log: []string{"msg=config", "reason=read config: 2 documents are marked active: true; keep one"}},

		// The node's own document: an operator's bad maxthreads is named
		// and the node keeps its cap.
		{name: "node/maxthreads a string", coll: "nodes", docs: badOne(func(e *badDocEnv) bson.D { return bson.D{badKV("maxthreads", "lots")} }),
			log: []string{"heartbeat written, but the node document cannot be read back", `field "maxthreads": want an integer, got string "lots"`}},
		{name: "node/maxthreads negative", coll: "nodes", docs: badOne(func(e *badDocEnv) bson.D { return bson.D{badKV("maxthreads", -5)} }),
			log: []string{"heartbeat written, but the node document cannot be read back", `field "maxthreads": -5 is out of range`}},
		{name: "node/maxthreads huge", coll: "nodes", docs: badOne(func(e *badDocEnv) bson.D { return bson.D{badKV("maxthreads", int64(1)<<40)} }),
			log: []string{"heartbeat written, but the node document cannot be read back", `field "maxthreads": 1099511627776 is out of range`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { e.run(t, c) })
	}

	require.False(t, e.node.exited(), "the node exited: %v", e.node.err)
	require.NotContains(t, e.node.log.String(), "panic")

	// Through it all the projector kept the good queue's counters exact.
	// (A context of its own: the table above takes 15 s alone and twice
	// that beside the package's other tests, past the first one's 30.)
	ctx = badCtx(t)
	deadline := time.Now().Add(15 * time.Second)
	for {
		counts, err := e.st.QueueCountsGet(ctx)
		require.NoError(t, err)
		q, err := e.st.QueueGet(ctx, store.QueueGetParams{Ref: "good"})
		require.NoError(t, err)
		want := counts[e.good]
		if q.CountTodo != nil && q.CountTotal != nil && *q.CountTodo == want.Todo && *q.CountTotal == want.Total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the good queue's counters are %s/%s (count_todo/count_total); a recount says %d/%d",
				badFmtPtr(q.CountTodo), badFmtPtr(q.CountTotal), want.Todo, want.Total)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run puts c's documents into MongoDB and checks what the node makes of
// them, then that a good task still runs.
func (e *badDocEnv) run(t *testing.T, c badDocCase) {
	ctx := badCtx(t)
	docs := c.docs(e)
	id := docs[0][0].Value // every doc starts with its _id (nodes: unused)
	idText := fmt.Sprint(id)
	if oid, ok := id.(bson.ObjectID); ok {
		idText = oid.Hex()
	}
	fill := func(ss []string) []string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = strings.NewReplacer("{id}", idText, "{good}", e.good.Hex(), "{qname}", "q-"+idText[max(0, len(idText)-8):], "{node}", e.name).Replace(s)
		}
		return out
	}
	coll := badMajority(e.db, c.coll)
	heartbeatsBack := badLogCount(e.node, "msg=node document readable again")

	// The document checked for its fate: the task itself, or a good task
	// put into the malformed queue.
	var subject bson.D
	switch c.coll {
	case "nodes":
		_, err := coll.UpdateOne(ctx, bson.D{badKV("node", e.name)}, bson.D{badKV("$set", docs[0])})
		require.NoError(t, err)
		t.Cleanup(func() {
			unset := bson.D{}
			for _, f := range docs[0] {
				unset = append(unset, badKV(f.Key, ""))
			}
			_, err := coll.UpdateOne(context.Background(), bson.D{badKV("node", e.name)}, bson.D{badKV("$unset", unset)})
			require.NoError(t, err)
			badWaitLogCount(t, e.node, 10*time.Second, heartbeatsBack+1, "msg=node document readable again")
		})
	case "config":
		for _, d := range docs {
			_, err := coll.InsertOne(ctx, d)
			require.NoError(t, err)
		}
		t.Cleanup(func() {
			_, err := coll.DeleteMany(context.Background(), bson.D{})
			require.NoError(t, err)
		})
	default:
		for _, d := range docs {
			_, err := coll.InsertOne(ctx, d)
			require.NoError(t, err)
		}
		subject = docs[0]
		if oid, ok := id.(bson.ObjectID); ok && c.coll == "queues" && c.fate != fateUnchecked {
			subject = e.task(badKV("queue", oid))
			_, err := badMajority(e.db, "tasks").InsertOne(ctx, subject)
			require.NoError(t, err)
		}
	}

	if len(c.log) > 0 {
		badWaitLog(t, e.node, 15*time.Second, fill(c.log)...)
	}
	var subjectID any
	if subject != nil {
		subjectID = subject[0].Value
	}
	switch c.fate {
	case fateFailed:
		x := e.waitTask(t, subjectID, "failed", func(x bson.M) bool { return x["status"] == int32(2) })
		stderr, _ := x["stderr"].(string)
		for _, s := range fill(c.taskStderr) {
			require.Contains(t, stderr, s, "stderr of the task")
		}
		require.Equal(t, e.name, x["node"])
	case fateSucceeded:
		x := e.waitTask(t, subjectID, "succeeded", func(x bson.M) bool { return x["status"] == int32(1) })
		require.Equal(t, apple, x["stdout"])
	case fateClaimed:
		x := e.waitTask(t, subjectID, "claimed", func(x bson.M) bool { return x["status"] == int32(-1) })
		require.Equal(t, e.name, x["node"])
	}

	// Whatever lies beside it, a good task of the good queue runs.
	e.goodTaskRuns(t)

	if c.fate == fateUntouched {
		raw, err := badMajority(e.db, "tasks").FindOne(ctx, bson.D{badKV("_id", subjectID)}).Raw()
		require.NoError(t, err)
		require.Equal(t, badRaw(t, subject).String(), raw.String(), "the task was changed")
	}
	if len(c.cliArgs) > 0 {
		args := append([]string{"--mongo-uri", e.uri, "--database", e.db.Name()}, c.cliArgs...)
		r := runBin(t, disbatchBin, "", nil, args...)
		show := fmt.Sprintf("disbatch %s\nstdout:\n%s\nstderr:\n%s", strings.Join(c.cliArgs, " "), r.stdout, r.stderr)
		require.Zero(t, r.code, show)
		for _, s := range fill(c.cliStderr) {
			require.Contains(t, r.stderr, s, show)
		}
		for _, s := range fill(c.cliStdout) {
			require.Contains(t, r.stdout, s, show)
		}
	}
}

// goodTaskRuns submits a well-formed task to the good queue and waits for
// it to succeed.
func (e *badDocEnv) goodTaskRuns(t *testing.T) {
	t.Helper()
	ids, err := e.st.TaskInsertMany(badCtx(t), store.TaskInsertManyParams{Queue: e.good, Parameters: []bson.Raw{badRaw(t, bson.D{badKV("commands", "a")})}})
	require.NoError(t, err)
	x := e.waitTask(t, ids[0], "a good task succeeded", func(x bson.M) bool { return x["status"] == int32(1) })
	require.Equal(t, apple, x["stdout"])
}

// waitTask polls the task with this _id until done, failing after 15 s with
// what it saw last.
func (e *badDocEnv) waitTask(t *testing.T, id any, what string, done func(bson.M) bool) bson.M {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var x bson.M
		err := e.db.Collection("tasks").FindOne(badCtx(t), bson.D{badKV("_id", id)},
			options.FindOne().SetProjection(bson.D{badKV("parameters", 0)})).Decode(&x)
		require.NoError(t, err)
		if done(x) {
			return x
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %v: not %s within 15s: %v", id, what, x)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// badLogLines renders each JSON line of p's log as "key=value ..." with
// its keys sorted and its values unquoted, so that substrings can be
// written as they read (slog's JSON escapes the quotes of error texts).
func badLogLines(p *proc) []string {
	var out []string
	for line := range strings.Lines(p.log.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue // not a log record (e.g. a race report)
		}
		var b bytes.Buffer
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, "%s=%v ", k, m[k])
		}
		out = append(out, b.String())
	}
	return out
}

// badLogCount counts the lines of p's log that contain every one of subs.
func badLogCount(p *proc, subs ...string) int {
	n := 0
	for _, l := range badLogLines(p) {
		if badContainsAll(l, subs) {
			n++
		}
	}
	return n
}

func badContainsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// badWaitLog waits until one line of p's log contains every one of subs.
func badWaitLog(t *testing.T, p *proc, timeout time.Duration, subs ...string) {
	t.Helper()
	badWaitLogCount(t, p, timeout, 1, subs...)
}

// badWaitLogCount waits until n lines of p's log contain every one of subs.
func badWaitLogCount(t *testing.T, p *proc, timeout time.Duration, n int, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for badLogCount(p, subs...) < n {
		if p.exited() && badLogCount(p, subs...) < n {
			t.Fatalf("disbatchd exited (%v) before logging %q", p.err, subs)
		}
		if time.Now().After(deadline) {
			t.Fatalf("disbatchd did not log a line with all of %q within %v", subs, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
