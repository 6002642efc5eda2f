package mongod

import (
	"errors"
	"net"
	"os"
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

// majorityWrite inserts a document through the replica set URI with write
// concern majority.
func majorityWrite(t *testing.T, rs *ReplicaSet) {
	t.Helper()
	majorityWriteWithin(t, rs, 30*time.Second)
}

// majorityWriteWithin is majorityWrite given d to be acknowledged.
func majorityWriteWithin(t *testing.T, rs *ReplicaSet, d time.Duration) {
	t.Helper()
	ctx := testContext(t, d)
	c, err := mongo.Connect(options.Client().ApplyURI(rs.URI()))
	require.NoError(t, err)
	defer disconnect(c)
	coll := c.Database("app").Collection("c", options.Collection().SetWriteConcern(writeconcern.Majority()))
	_, err = coll.InsertOne(ctx, bson.D{{Key: "at", Value: time.Now()}})
	require.NoError(t, err)
}

func TestStartStopSingleMember(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	begin := time.Now()
	rs, err := StartReplicaSet(ctx, Options{Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rs.Stop() })
	t.Logf("single-member replica set started in %v", time.Since(begin))

	require.Regexp(t, `^mongodb://127\.0\.0\.1:\d+/\?replicaSet=rs0$`, rs.URI())
	require.Len(t, rs.Members(), 1)
	m := rs.Members()[0]
	require.Equal(t, "127.0.0.1:"+rs.URI()[len("mongodb://127.0.0.1:"):len(rs.URI())-len("/?replicaSet=rs0")], m.Addr())
	pid, dir, watchdog := m.PID(), rs.Dir(), rs.watchdog.Process.Pid
	require.Regexp(t, `/disbatch-mongod-[^/]+$`, dir)
	require.True(t, processAlive(pid))
	require.True(t, processAlive(watchdog))
	require.DirExists(t, dir)
	require.FileExists(t, filepath.Join(dir, "m0", "pid"))
	p, err := rs.WaitPrimary(ctx)
	require.NoError(t, err)
	require.Same(t, m, p)
	majorityWrite(t, rs)

	begin = time.Now()
	require.NoError(t, rs.Stop())
	t.Logf("stopped in %v", time.Since(begin))
	require.False(t, processAlive(pid), "mongod %d still running", pid)
	require.False(t, processAlive(watchdog), "watchdog %d still running", watchdog)
	require.NoDirExists(t, dir)
	require.NoError(t, rs.Stop(), "second Stop")
	require.Error(t, m.Restart(ctx), "Restart after Stop")
}

func TestRestartSameDataAndPortClash(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	rs, err := StartReplicaSet(ctx, Options{
		ReplSet:   "other",
		Logger:    testLogger(t),
		ExtraArgs: []string{"--oplogSize=100", "--setParameter", "shutdownTimeoutMillisForSignaledShutdown=200"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	require.Regexp(t, `/\?replicaSet=other$`, rs.URI())
	majorityWrite(t, rs)

	// ExtraArgs replaced the defaults.
	c, err := mongo.Connect(options.Client().ApplyURI(rs.URI()))
	require.NoError(t, err)
	defer disconnect(c)
	var param struct {
		Timeout int `bson:"shutdownTimeoutMillisForSignaledShutdown"`
	}
	require.NoError(t, c.Database("admin").RunCommand(ctx, bson.D{
		{Key: "getParameter", Value: 1}, {Key: "shutdownTimeoutMillisForSignaledShutdown", Value: 1},
	}).Decode(&param))
	require.Equal(t, 200, param.Timeout)

	m := rs.Members()[0]
	require.Error(t, m.Restart(ctx), "Restart of a running member")
	oldPID := m.PID()
	require.NoError(t, m.Kill())
	require.False(t, processAlive(oldPID))
	require.NoFileExists(t, filepath.Join(rs.dir, "m0", "pid"))
	require.NoError(t, m.Kill(), "second Kill")

	// Someone else takes the port: Restart fails and shows mongod's log.
	l, err := net.Listen("tcp", m.Addr())
	require.NoError(t, err)
	err = m.Restart(ctx)
	require.Error(t, err)
	require.True(t, errors.Is(err, errPortInUse), "%v", err)
	require.ErrorContains(t, err, "last ")
	require.ErrorContains(t, err, "Address already in use")
	require.NoError(t, l.Close())

	require.NoError(t, m.Restart(ctx))
	require.NotEqual(t, oldPID, m.PID())
	require.FileExists(t, filepath.Join(rs.dir, "m0", "pid"))
	_, err = rs.WaitPrimary(ctx)
	require.NoError(t, err)

	// Same data directory: the document written before the kill is there.
	n, err := c.Database("app").Collection("c").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	disconnect(c)

	require.NoError(t, m.Stop())
	require.False(t, processAlive(m.PID()))
	require.NoError(t, m.Stop(), "second Stop")
}

func TestFirstStartMovesOffATakenPort(t *testing.T) {
	ctx := testContext(t, time.Minute)
	bin, err := Binary()
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	dir := t.TempDir()
	rs := &ReplicaSet{name: "rs0", dir: dir, binary: bin, log: testLogger(t)}
	m := &Member{rs: rs, dir: filepath.Join(dir, "m0"), port: taken}
	rs.members = []*Member{m}
	err = m.firstStart(ctx)
	t.Cleanup(func() { require.NoError(t, m.Kill()) })
	require.NoError(t, err)
	require.NotEqual(t, taken, m.port)
	require.True(t, processAlive(m.PID()))
	require.FileExists(t, filepath.Join(dir, "m0", "mongod.log.prev"), "no failed first attempt")
}

// A member on a port of Options.Ports stays on it: a mongod that cannot bind
// it fails the start, naming the port, with mongod's log.
func TestFirstStartFixedPortTaken(t *testing.T) {
	ctx := testContext(t, time.Minute)
	bin, err := Binary()
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	dir := t.TempDir()
	rs := &ReplicaSet{name: "rs0", dir: dir, binary: bin, log: testLogger(t)}
	m := &Member{rs: rs, dir: filepath.Join(dir, "m0"), port: taken, fixedPort: true}
	rs.members = []*Member{m}
	err = m.firstStart(ctx)
	t.Cleanup(func() { require.NoError(t, m.Kill()) })
	require.Error(t, err)
	require.True(t, errors.Is(err, errPortInUse), "%v", err)
	require.ErrorContains(t, err, "port "+strconv.Itoa(taken)+": something already listens there")
	require.ErrorContains(t, err, "Address already in use")
	require.Equal(t, taken, m.port)
}

func TestMemberArgs(t *testing.T) {
	m := &Member{rs: &ReplicaSet{name: "rs0"}, dir: "/d/m0", port: 1234}
	require.Equal(t, []string{
		"--replSet", "rs0", "--bind_ip", "127.0.0.1", "--port", "1234",
		"--dbpath", "/d/m0", "--logpath", "/d/m0/mongod.log", "--nounixsocket",
		"--oplogSize", "256", "--wiredTigerCacheSizeGB", "0.25",
		"--setParameter", "diagnosticDataCollectionEnabled=false",
		"--setParameter", "shutdownTimeoutMillisForSignaledShutdown=500",
	}, m.args())

	m.rs.extra = []string{
		"--oplogSize=100", "--wiredTigerCacheSizeGB", "1",
		"--setParameter=diagnosticDataCollectionEnabled=true",
		"--setParameter", "shutdownTimeoutMillisForSignaledShutdown=9",
		"--setParameter", "enableTestCommands=1",
	}
	require.Equal(t, append([]string{
		"--replSet", "rs0", "--bind_ip", "127.0.0.1", "--port", "1234",
		"--dbpath", "/d/m0", "--logpath", "/d/m0/mongod.log", "--nounixsocket",
	}, m.rs.extra...), m.args())
}

func TestStartFailureShowsLogAndCleansUp(t *testing.T) {
	ctx := testContext(t, time.Minute)
	before, err := filepath.Glob(filepath.Join(os.TempDir(), "disbatch-mongod-*"))
	require.NoError(t, err)

	// Fails once logging is set up: the log tail must be in the error.
	_, err = StartReplicaSet(ctx, Options{ExtraArgs: []string{"--setParameter", "noSuchParameter=1"}})
	require.Error(t, err)
	require.ErrorContains(t, err, "exited during start")
	require.ErrorContains(t, err, "noSuchParameter")

	// Fails while parsing options, before mongod has a log.
	_, err = StartReplicaSet(ctx, Options{ExtraArgs: []string{"--noSuchOption"}})
	require.Error(t, err)
	require.ErrorContains(t, err, "unrecognised option '--noSuchOption'")

	after, err := filepath.Glob(filepath.Join(os.TempDir(), "disbatch-mongod-*"))
	require.NoError(t, err)
	require.ElementsMatch(t, before, after, "temp dirs left behind")
}

func TestThreeMemberFailover(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	begin := time.Now()
	rs, err := StartReplicaSet(ctx, Options{Members: 3, Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	t.Logf("three-member replica set started in %v", time.Since(begin))
	require.Regexp(t, `^mongodb://127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,127\.0\.0\.1:\d+/\?replicaSet=rs0$`, rs.URI())

	members := rs.Members()
	require.Len(t, members, 3)
	primaries := 0
	for _, m := range members {
		h, err := m.hello(ctx)
		require.NoError(t, err)
		require.Equal(t, "rs0", h.SetName)
		require.Equal(t, m.Addr(), h.Me)
		if h.IsWritablePrimary {
			primaries++
		} else {
			require.True(t, h.Secondary, "%s is neither primary nor secondary", m.Addr())
		}
	}
	require.Equal(t, 1, primaries)
	old, err := rs.WaitPrimary(ctx)
	require.NoError(t, err)
	require.Same(t, members[0], old)
	majorityWrite(t, rs)

	oldPID := old.PID()
	require.NoError(t, old.Kill())
	require.False(t, processAlive(oldPID))
	killed := time.Now()
	failoverCtx := testContext(t, 30*time.Second)
	primary, err := rs.WaitPrimary(failoverCtx)
	require.NoError(t, err)
	require.NotSame(t, old, primary)
	t.Logf("new primary %s elected %v after the kill", primary.Addr(), time.Since(killed))
	// Two of three members make a majority, once the surviving secondary
	// syncs from the new primary. A CI run of the whole suite (two busy
	// cores) once took over 30 s for it: give it two minutes, and say.
	acked := time.Now()
	majorityWriteWithin(t, rs, 2*time.Minute)
	t.Logf("a majority write acknowledged %v after the new primary", time.Since(acked))

	restarted := time.Now()
	require.NoError(t, old.Restart(ctx))
	require.Eventually(t, func() bool {
		h, err := old.hello(ctx)
		return err == nil && h.Secondary && h.Primary == primary.Addr()
	}, 30*time.Second, 100*time.Millisecond, "restarted member did not rejoin as secondary")
	t.Logf("killed member rejoined as secondary %v after Restart", time.Since(restarted))

	// Member 0's priority was reset, so it does not take over again.
	time.Sleep(3 * time.Second)
	p, err := rs.WaitPrimary(ctx)
	require.NoError(t, err)
	require.Same(t, primary, p)
	majorityWrite(t, rs)
}
