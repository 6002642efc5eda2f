package mongod

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// freePortsT returns n free loopback ports.
func freePortsT(t *testing.T, n int) []int {
	t.Helper()
	ports, err := freePorts(n)
	require.NoError(t, err)
	return ports
}

// connect returns a client for rs, disconnected when the test ends.
func connect(t *testing.T, rs *ReplicaSet) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(rs.URI()))
	require.NoError(t, err)
	t.Cleanup(func() { disconnect(c) })
	return c
}

// keptCollection is where the Dir tests keep a document across restarts.
func keptCollection(c *mongo.Client) *mongo.Collection {
	return c.Database("app").Collection("kept", options.Collection().SetWriteConcern(writeconcern.Majority()))
}

// requireKeptDocument checks that the document written by the first start
// is there, and that the set takes majority writes.
func requireKeptDocument(t *testing.T, rs *ReplicaSet) {
	t.Helper()
	ctx := testContext(t, 30*time.Second)
	coll := keptCollection(connect(t, rs))
	var doc struct {
		N int `bson:"n"`
	}
	require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: "kept"}}).Decode(&doc))
	require.Equal(t, 42, doc.N)
	_, err := coll.InsertOne(ctx, bson.D{{Key: "after", Value: "restart"}})
	require.NoError(t, err)
}

// A set started on Options.Dir and Options.Ports keeps its data when stopped
// and starts again from it: no second initiate, a primary, writable.
func TestDirAndPortsRestart(t *testing.T) {
	for _, members := range []int{1, 3} {
		t.Run(strconv.Itoa(members), func(t *testing.T) {
			ctx := testContext(t, 3*time.Minute)
			dir := filepath.Join(t.TempDir(), "data") // created by StartReplicaSet
			ports := freePortsT(t, members)
			opts := Options{Members: members, Dir: dir, Ports: ports, Logger: testLogger(t)}

			begin := time.Now()
			rs, err := StartReplicaSet(ctx, opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = rs.Stop() })
			t.Logf("fresh set started in %v", time.Since(begin))
			require.Equal(t, dir, rs.Dir())
			require.Nil(t, rs.watchdog, "a watchdog runs for Options.Dir")
			for i, m := range rs.Members() {
				require.Equal(t, "127.0.0.1:"+strconv.Itoa(ports[i]), m.Addr())
			}
			p, err := rs.WaitPrimary(ctx)
			require.NoError(t, err)
			require.Same(t, rs.Members()[0], p)
			_, err = keptCollection(connect(t, rs)).InsertOne(ctx, bson.D{{Key: "_id", Value: "kept"}, {Key: "n", Value: 42}})
			require.NoError(t, err)
			pids := make([]int, members)
			for i, m := range rs.Members() {
				pids[i] = m.PID()
			}

			require.NoError(t, rs.Stop())
			for _, pid := range pids {
				require.False(t, processAlive(pid), "mongod %d still running", pid)
			}
			for i := range members {
				require.FileExists(t, filepath.Join(dir, "m"+strconv.Itoa(i), "WiredTiger"))
			}
			require.ErrorContains(t, rs.Members()[0].Restart(ctx), "stopped", "Restart after Stop")

			begin = time.Now()
			rs, err = StartReplicaSet(ctx, opts)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, rs.Stop()) })
			t.Logf("set restarted from %s in %v", dir, time.Since(begin))
			_, err = rs.WaitPrimary(ctx)
			require.NoError(t, err)
			requireKeptDocument(t, rs)

			// A member keeps working as before.
			m := rs.Members()[members-1]
			require.NoError(t, m.Stop())
			require.NoError(t, m.Restart(ctx))
			requireKeptDocument(t, rs)
		})
	}
}

// Starting a set on a Dir whose config names other hosts or another set
// fails at once instead of waiting for a primary that never comes; so does a
// start on a Dir that a running set uses. Neither harms the data.
func TestDirMismatchAndInUse(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	dir := t.TempDir()
	opts := Options{Dir: dir, Ports: freePortsT(t, 1), Logger: testLogger(t)}
	rs, err := StartReplicaSet(ctx, opts)
	require.NoError(t, err)
	_, err = keptCollection(connect(t, rs)).InsertOne(ctx, bson.D{{Key: "_id", Value: "kept"}, {Key: "n", Value: 42}})
	require.NoError(t, err)

	// In use by the running set (on another port, or the port check would
	// come first).
	begin := time.Now()
	_, err = StartReplicaSet(ctx, Options{Dir: dir, Ports: freePortsT(t, 1), Logger: testLogger(t)})
	t.Logf("in use: %v", err)
	require.Error(t, err)
	require.True(t, errors.Is(err, errDBPathInUse), "%v", err)
	require.ErrorContains(t, err, filepath.Join(dir, "m0")+" is locked by pid "+strconv.Itoa(rs.Members()[0].PID()))
	require.Less(t, time.Since(begin), 5*time.Second)
	requireKeptDocument(t, rs)
	require.NoError(t, rs.Stop())

	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"other port", Options{Dir: dir, Ports: freePortsT(t, 1)}},
		{"other name", Options{Dir: dir, Ports: opts.Ports, ReplSet: "rs1"}},
		{"more members", Options{Dir: dir, Members: 2, Ports: append(freePortsT(t, 1), opts.Ports...)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = testLogger(t)
			begin := time.Now()
			_, err := StartReplicaSet(testContext(t, time.Minute), tc.opts)
			t.Logf("after %v: %v", time.Since(begin), err)
			require.Error(t, err)
			require.ErrorContains(t, err, "start it with the same ReplSet, Members and Ports")
		})
	}

	// The data is still there and the original options still work.
	rs, err = StartReplicaSet(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	requireKeptDocument(t, rs)
}

// A port of Options.Ports that something listens on fails the start at once,
// naming the port, before anything is created.
func TestFixedPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	dir := filepath.Join(t.TempDir(), "data")

	begin := time.Now()
	_, err = StartReplicaSet(testContext(t, time.Minute), Options{
		Members: 2, Dir: dir, Ports: append(freePortsT(t, 1), taken), Logger: testLogger(t),
	})
	t.Logf("%v", err)
	require.Error(t, err)
	require.True(t, errors.Is(err, errPortInUse), "%v", err)
	require.ErrorContains(t, err, "port "+strconv.Itoa(taken)+": something already listens there")
	require.ErrorContains(t, err, "(another mongod? stop it or pick another port)")
	require.Less(t, time.Since(begin), time.Second)
	require.NoDirExists(t, dir)
}

func TestPortsChecked(t *testing.T) {
	ctx := testContext(t, time.Minute)
	for _, tc := range []struct {
		members int
		ports   []int
		want    string
	}{
		{0, []int{1, 2}, "2 ports for 1 members"},
		{3, []int{1, 2}, "2 ports for 3 members"},
		{2, []int{0, 2}, "port 0 is not a TCP port"},
		{1, []int{70000}, "port 70000 is not a TCP port"},
		{2, []int{5, 5}, "port 5 is given twice"},
	} {
		_, err := StartReplicaSet(ctx, Options{Members: tc.members, Ports: tc.ports})
		require.ErrorContains(t, err, tc.want)
	}
}

// A mongod that exits because its dbpath is locked (a race that the check
// before the start cannot exclude) is reported as such, with its log.
func TestExitErrorLocked(t *testing.T) {
	dir := t.TempDir()
	m := &Member{rs: &ReplicaSet{}, id: 1, dir: dir, port: 1234}
	require.NoError(t, os.WriteFile(m.logPath(), []byte(`{"msg":"DBException in initAndListen, terminating",`+
		`"attr":{"error":"DBPathInUse: Unable to lock the lock file: /x/mongod.lock (Resource temporarily unavailable). `+
		`Another mongod instance is already running on the /x directory"}}`+"\n"), 0o644))
	cmd := exec.Command("false")
	err := cmd.Run()
	p := &process{cmd: cmd, done: make(chan struct{}), err: err}
	close(p.done)
	err = m.exitError(p)
	require.True(t, errors.Is(err, errDBPathInUse), "%v", err)
	require.ErrorContains(t, err, "member 1: "+dir+" is locked by another mongod")
	require.ErrorContains(t, err, "--- last 1 lines of "+m.logPath())
}
