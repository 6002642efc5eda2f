package mongod

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
)

const (
	// defaultStartTimeout bounds StartReplicaSet when ctx has no deadline.
	defaultStartTimeout = 2 * time.Minute
	// stopGrace is how long Member.Stop waits after SIGTERM before SIGKILL.
	stopGrace = 15 * time.Second
	// portAttempts is how often a member start is tried on fresh ports
	// when its port was taken between picking and binding it.
	portAttempts = 5
	// logTailLines is how many log lines an error about a dead mongod shows.
	logTailLines = 20
	// probeDatabase is the scratch database used to check that the set is
	// writable; it is dropped again.
	probeDatabase = "disbatch_mongod_probe"
	// Server error codes.
	codeAlreadyInitialized = 23 // replSetInitiate: the member has a config
	codeNotYetInitialized  = 94 // the member has not loaded its config yet
)

// Options configures StartReplicaSet. The zero value is a single-member set.
type Options struct {
	// Members is the number of members (default 1). With more than one,
	// member 0 is primary after StartReplicaSet returns.
	Members int
	// Binary is the mongod to run (default: Binary()).
	Binary string
	// ReplSet is the replica set name (default "rs0").
	ReplSet string
	// Dir, when set, is where the members' data lives (Dir/m0, Dir/m1, ...): it
	// is created if missing, reused if it holds data, and kept by Stop. No
	// watchdog runs (the mongods still die with the parent through Pdeathsig).
	Dir string
	// Ports, when set (len == Members), are the members' ports instead of free ones.
	Ports []int
	// Logger receives progress messages (default: discarded).
	Logger *slog.Logger
	// ExtraArgs are appended to every member's mongod command line. They may
	// replace the tunable defaults (see StartReplicaSet) but no other option.
	ExtraArgs []string
	// ClientTLS, when set, is the TLS configuration of this package's own
	// connections (members started with --tlsMode requireTLS in
	// ExtraArgs). URI does not carry it: callers add their own options.
	ClientTLS *tls.Config
	// Root, when set, is a user created (through MongoDB's localhost
	// exception) with the role root once the set has a primary, and the
	// credentials of this package's own connections after that: for
	// members started with --auth and --keyFile in ExtraArgs.
	Root *options.Credential
}

// ReplicaSet is a MongoDB replica set of local mongod processes, with all its
// data in one directory (Options.Dir or a temporary one). Stop it when done.
type ReplicaSet struct {
	name    string
	dir     string
	keepDir bool // dir is Options.Dir: never removed
	binary  string
	extra   []string
	tls     *tls.Config
	root    *options.Credential // set once the root user exists
	log     *slog.Logger
	members []*Member

	watchdog *exec.Cmd // nil with Options.Dir

	stopped  atomic.Bool // Stop was called; no more Restarts
	stopOnce sync.Once
	stopErr  error
}

// Member is one mongod of a ReplicaSet. Its port and data directory stay the
// same across Stop/Kill and Restart.
type Member struct {
	rs        *ReplicaSet
	id        int
	dir       string
	port      int  // fixed once StartReplicaSet has returned
	fixedPort bool // port is from Options.Ports: never moved to another

	mu   sync.Mutex              // serialises Kill, Stop and Restart
	proc atomic.Pointer[process] // current or last process; nil before the first start
}

// process is one run of mongod.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // cmd.Wait's result, valid once done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// noPdeathsig leaves Pdeathsig off, so that tests can check the watchdog alone.
var noPdeathsig bool

// errPortInUse means mongod could not bind its port, or (with Options.Ports)
// that something listened on it before mongod was started.
var errPortInUse = errors.New("port already in use")

// errDBPathInUse means another process (a mongod) holds the lock of a
// member's data directory.
var errDBPathInUse = errors.New("data directory in use by another mongod")

// kindError is an error of a kind (errPortInUse, errDBPathInUse) for
// errors.Is, with a message of its own and an optional cause.
type kindError struct {
	kind  error
	msg   string
	cause error
}

func (e *kindError) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + ": " + e.cause.Error()
}

func (e *kindError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// StartReplicaSet starts opts.Members mongod processes on loopback ports
// (opts.Ports, or free ones), initiates them as replica set opts.ReplSet and
// returns once a primary is elected and a majority write through URI()
// succeeds.
//
// Each member runs
//
//	mongod --replSet NAME --bind_ip 127.0.0.1 --port P --dbpath DIR/mN
//	  --logpath DIR/mN/mongod.log --nounixsocket
//	  --oplogSize 256 --wiredTigerCacheSizeGB 0.25
//	  --setParameter diagnosticDataCollectionEnabled=false
//	  --setParameter shutdownTimeoutMillisForSignaledShutdown=500
//	  EXTRA_ARGS...
//
// where DIR is opts.Dir (made absolute) or else a fresh
// os.MkdirTemp("", "disbatch-mongod-*"). ExtraArgs may set the options and
// parameters of the third to fifth lines; the defaults are then left out.
//
// The set is initiated through member 0 with members {_id: i, host:
// "127.0.0.1:P"}. A set of more than one member gets electionTimeoutMillis
// 2000 and heartbeatIntervalMillis 500, so that a failover takes about two
// seconds; member 0 gets priority 2 and is asked to step up at once, so it is
// the first primary, and then its priority is set back to 1 (replSetReconfig)
// so that it does not take over again after a failover and a Restart.
//
// If opts.Dir holds a set that was initiated before, its config is kept (no
// initiate, no priority change) and whichever member the set elects is the
// primary. Its config must name the same set and hosts, so restart such a set
// with the same ReplSet, Members and Ports; otherwise StartReplicaSet fails.
//
// With opts.Ports, a port that something already listens on fails the start
// at once (there is no retry on other ports), and so does a member's data
// directory that another mongod holds.
//
// If anything fails, everything started so far is stopped, and a temporary
// directory is removed.
func StartReplicaSet(ctx context.Context, opts Options) (_ *ReplicaSet, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("mongod: start replica set: %w", err)
		}
	}()
	if opts.Members <= 0 {
		opts.Members = 1
	}
	if opts.ReplSet == "" {
		opts.ReplSet = "rs0"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Ports != nil {
		if err := checkPorts(opts.Ports, opts.Members); err != nil {
			return nil, err
		}
	}
	if opts.Binary == "" {
		if opts.Binary, err = Binary(); err != nil {
			return nil, err
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}
	begin := time.Now()

	var dir string
	if opts.Dir != "" {
		if dir, err = filepath.Abs(opts.Dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	} else if dir, err = os.MkdirTemp("", "disbatch-mongod-*"); err != nil {
		return nil, err
	}
	rs := &ReplicaSet{
		name:    opts.ReplSet,
		dir:     dir,
		keepDir: opts.Dir != "",
		binary:  opts.Binary,
		extra:   append([]string(nil), opts.ExtraArgs...),
		tls:     opts.ClientTLS,
		log:     opts.Logger.With("replset", opts.ReplSet, "dir", dir),
	}
	defer func() {
		if err != nil {
			_ = rs.Stop()
		}
	}()
	// The watchdog comes first, so that even a crash during the start leaves
	// nothing behind.
	if !rs.keepDir {
		if err := rs.startWatchdog(); err != nil {
			return nil, err
		}
	}

	ports := opts.Ports
	if ports == nil {
		if ports, err = freePorts(opts.Members); err != nil {
			return nil, err
		}
	}
	for i := range opts.Members {
		rs.members = append(rs.members, &Member{
			rs:        rs,
			id:        i,
			dir:       filepath.Join(dir, "m"+strconv.Itoa(i)),
			port:      ports[i],
			fixedPort: opts.Ports != nil,
		})
	}
	errs := make([]error, len(rs.members))
	var wg sync.WaitGroup
	for i, m := range rs.members {
		wg.Go(func() { errs[i] = m.firstStart(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	rs.log.Debug("mongod processes up", "elapsed", time.Since(begin))

	initiated, err := rs.initiate(ctx)
	if err != nil {
		return nil, err
	}
	switch {
	case !initiated:
		// Dir held a set initiated before: it elects a primary by itself.
		rs.log.Info("replica set in dir initiated before: reusing it")
		if err := rs.checkConfig(ctx); err != nil {
			return nil, err
		}
		if _, err := rs.WaitPrimary(ctx); err != nil {
			return nil, err
		}
	case len(rs.members) == 1:
		// A single member elects itself at once.
		if _, err := rs.WaitPrimary(ctx); err != nil {
			return nil, err
		}
	default:
		if err := rs.stepUp(ctx, rs.members[0]); err != nil {
			return nil, err
		}
	}
	rs.log.Debug("primary elected", "elapsed", time.Since(begin))
	if initiated && len(rs.members) > 1 {
		if err := rs.resetPriority(ctx); err != nil {
			return nil, err
		}
		rs.log.Debug("priority of member 0 reset", "elapsed", time.Since(begin))
	}
	if opts.Root != nil {
		if err := rs.createRoot(ctx, *opts.Root, initiated); err != nil {
			return nil, err
		}
	}
	if err := rs.probeWrite(ctx); err != nil {
		return nil, err
	}
	// A majority write needs two members of three: the third may still be
	// in its initial sync, and a failover test would find it neither
	// primary nor secondary.
	if err := rs.waitServing(ctx); err != nil {
		return nil, err
	}
	rs.log.Info("replica set ready", "uri", rs.URI(), "elapsed", time.Since(begin))
	return rs, nil
}

// waitServing waits until every member says it is the primary or a
// secondary.
func (rs *ReplicaSet) waitServing(ctx context.Context) error {
	for {
		var last []string
		for _, m := range rs.members {
			h, err := m.hello(ctx)
			switch {
			case err != nil:
				last = append(last, fmt.Sprintf("%s: %v", m.Addr(), err))
			case !h.IsWritablePrimary && !h.Secondary:
				last = append(last, m.Addr()+": neither primary nor secondary")
			}
		}
		if len(last) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("members not serving (%s): %w", strings.Join(last, "; "), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkPorts checks Options.Ports: one valid port per member, each once, and
// none that something listens on already.
func checkPorts(ports []int, members int) error {
	if len(ports) != members {
		return fmt.Errorf("%d ports for %d members", len(ports), members)
	}
	for i, p := range ports {
		if p <= 0 || p > 65535 {
			return fmt.Errorf("port %d is not a TCP port", p)
		}
		if slices.Contains(ports[:i], p) {
			return fmt.Errorf("port %d is given twice", p)
		}
	}
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if errors.Is(err, syscall.EADDRINUSE) {
			return portTakenError(p, nil)
		}
		if err != nil {
			return fmt.Errorf("port %d: %w", p, err)
		}
		_ = l.Close()
	}
	return nil
}

// portTakenError says that port p of Options.Ports is taken; cause, if not
// nil, is mongod's failure to bind it.
func portTakenError(p int, cause error) error {
	return &kindError{errPortInUse, fmt.Sprintf("port %d: something already listens there "+
		"(another mongod? stop it or pick another port)", p), cause}
}

// Dir is the directory that holds the members' data (Dir()/m0, Dir()/m1,
// ...): Options.Dir made absolute, or else the temporary directory that Stop
// removes.
func (rs *ReplicaSet) Dir() string { return rs.dir }

// URI is the connection string of the replica set:
// mongodb://127.0.0.1:P1[,127.0.0.1:P2,...]/?replicaSet=NAME.
func (rs *ReplicaSet) URI() string {
	hosts := make([]string, len(rs.members))
	for i, m := range rs.members {
		hosts[i] = m.Addr()
	}
	return "mongodb://" + strings.Join(hosts, ",") + "/?replicaSet=" + rs.name
}

// Members returns the members in replica set config order (_id 0, 1, ...).
func (rs *ReplicaSet) Members() []*Member {
	return append([]*Member(nil), rs.members...)
}

// WaitPrimary waits until a running member says it is the writable primary
// (hello's isWritablePrimary) and returns it.
func (rs *ReplicaSet) WaitPrimary(ctx context.Context) (*Member, error) {
	var last []string
	for {
		last = last[:0]
		for _, m := range rs.members {
			if !m.running() {
				last = append(last, fmt.Sprintf("%s: not running", m.Addr()))
				continue
			}
			h, err := m.hello(ctx)
			switch {
			case err != nil:
				last = append(last, fmt.Sprintf("%s: %v", m.Addr(), err))
			case h.IsWritablePrimary:
				return m, nil
			default:
				last = append(last, fmt.Sprintf("%s: secondary=%v", m.Addr(), h.Secondary))
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no primary (%s): %w", strings.Join(last, "; "), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops all members gracefully (see Member.Stop), then removes the
// temporary directory and ends the watchdog; Options.Dir is kept. It may be
// called more than once; later calls return the first call's result.
func (rs *ReplicaSet) Stop() error {
	rs.stopOnce.Do(func() {
		rs.stopped.Store(true)
		errs := make([]error, len(rs.members))
		var wg sync.WaitGroup
		for i, m := range rs.members {
			wg.Go(func() { errs[i] = m.Stop() })
		}
		wg.Wait()
		if !rs.keepDir {
			if err := os.RemoveAll(rs.dir); err != nil {
				errs = append(errs, err)
			}
		}
		errs = append(errs, rs.stopWatchdog())
		rs.stopErr = errors.Join(errs...)
		if rs.stopErr != nil {
			rs.stopErr = fmt.Errorf("mongod: stop replica set: %w", rs.stopErr)
		}
		rs.log.Debug("replica set stopped", "err", rs.stopErr)
	})
	return rs.stopErr
}

// Addr is the member's host:port, "127.0.0.1:PORT".
func (m *Member) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// PID is the process id of the member's current mongod, or of its last one
// if it is not running (0 if it never started).
func (m *Member) PID() int {
	p := m.proc.Load()
	if p == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL to the member's mongod and waits until it has exited.
// It does nothing if the member is not running.
func (m *Member) Kill() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.proc.Load()
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("mongod: kill member %d: %w", m.id, err)
	}
	<-p.done
	m.rs.log.Debug("mongod killed", "member", m.id, "pid", p.cmd.Process.Pid)
	return nil
}

// Stop sends SIGTERM to the member's mongod and waits up to 15 s for it to
// exit, then kills it with SIGKILL (and returns an error saying so). It does
// nothing if the member is not running.
func (m *Member) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.proc.Load()
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("mongod: stop member %d: %w", m.id, err)
	}
	timer := time.NewTimer(stopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
		m.rs.log.Debug("mongod stopped", "member", m.id, "pid", p.cmd.Process.Pid, "exit", p.err)
		return nil
	case <-timer.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("mongod: member %d (pid %d) did not stop within %v after SIGTERM; killed it",
		m.id, p.cmd.Process.Pid, stopGrace)
}

// Restart starts the member's mongod again on the same port with the same
// data directory and waits until it accepts connections. The member must
// have been stopped or killed first.
func (m *Member) Restart(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.proc.Load(); p != nil && !p.exited() {
		return fmt.Errorf("mongod: restart member %d: it is still running (pid %d)", m.id, p.cmd.Process.Pid)
	}
	if m.rs.stopped.Load() {
		return fmt.Errorf("mongod: restart member %d: the replica set was stopped", m.id)
	}
	if err := m.startLocked(ctx); err != nil {
		return fmt.Errorf("mongod: restart member %d: %w", m.id, err)
	}
	return nil
}

func (m *Member) running() bool {
	p := m.proc.Load()
	return p != nil && !p.exited()
}

// firstStart starts the member for StartReplicaSet, moving to another port if
// its free port was taken in the meantime (a port of Options.Ports stays).
func (m *Member) firstStart(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fixedPort {
		err := m.startLocked(ctx)
		if errors.Is(err, errPortInUse) {
			return portTakenError(m.port, err)
		}
		return err
	}
	var err error
	for range portAttempts {
		if err = m.startLocked(ctx); !errors.Is(err, errPortInUse) {
			return err
		}
		m.rs.log.Debug("port taken, retrying", "member", m.id, "port", m.port)
		ports, perr := freePorts(1)
		if perr != nil {
			return perr
		}
		m.port = ports[0]
	}
	return err
}

func (m *Member) args() []string {
	args := []string{
		"--replSet", m.rs.name,
		"--bind_ip", "127.0.0.1",
		"--port", strconv.Itoa(m.port),
		"--dbpath", m.dir,
		"--logpath", m.logPath(),
		// No /tmp/mongodb-PORT.sock, which a killed mongod would leave behind.
		"--nounixsocket",
	}
	// Tunable defaults: left out when ExtraArgs sets them (mongod rejects
	// an option or a parameter given twice).
	for _, d := range [][2]string{
		{"--oplogSize", "256"},
		{"--wiredTigerCacheSizeGB", "0.25"},
		{"--setParameter", "diagnosticDataCollectionEnabled=false"},
		// Without this, SIGTERM keeps a member of a multi-member set in
		// "quiesce mode" for 15 s (and a primary waits as long for a
		// secondary to catch up); the rest of the shutdown takes ~1 s.
		{"--setParameter", "shutdownTimeoutMillisForSignaledShutdown=500"},
	} {
		if !overridden(m.rs.extra, d[0], d[1]) {
			args = append(args, d[0], d[1])
		}
	}
	return append(args, m.rs.extra...)
}

// overridden reports whether extra sets the option flag (for --setParameter:
// the parameter named in value) itself.
func overridden(extra []string, flag, value string) bool {
	for i, a := range extra {
		if flag == "--setParameter" {
			name, _, _ := strings.Cut(value, "=")
			if a == flag && i+1 < len(extra) && strings.HasPrefix(extra[i+1], name+"=") ||
				strings.HasPrefix(a, flag+"="+name+"=") {
				return true
			}
			continue
		}
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

func (m *Member) logPath() string    { return filepath.Join(m.dir, "mongod.log") }
func (m *Member) outputPath() string { return filepath.Join(m.dir, "output.log") }
func (m *Member) pidPath() string    { return filepath.Join(m.dir, "pid") }

// startLocked starts mongod and waits until it accepts connections.
// m.mu must be held.
func (m *Member) startLocked(ctx context.Context) error {
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return err
	}
	// Leave the files of a mongod that runs on this dbpath alone.
	if err := m.checkUnlocked(); err != nil {
		return err
	}
	// A fresh log for every start, so that readiness is judged on this run's
	// log only (mongod would rename the old one itself, but not before it
	// could be read).
	if err := os.Rename(m.logPath(), m.logPath()+".prev"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	out, err := os.OpenFile(m.outputPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()

	cmd := exec.Command(m.rs.binary, m.args()...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = mongodSysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", m.rs.binary, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	m.proc.Store(p)
	pid := cmd.Process.Pid
	// The watchdog kills the pids listed in the pid files.
	pidErr := writeFileAtomic(m.pidPath(), []byte(strconv.Itoa(pid)+"\n"))
	go func() {
		p.err = cmd.Wait()
		// The pid may be reused from now on: keep the watchdog off it.
		_ = os.Remove(m.pidPath())
		close(p.done)
	}()
	if pidErr != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return pidErr
	}
	m.rs.log.Debug("mongod started", "member", m.id, "port", m.port, "pid", pid)

	if err := m.waitReady(ctx, p); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return err
	}
	return nil
}

// waitReady waits until the log of p says it is waiting for connections.
func (m *Member) waitReady(ctx context.Context, p *process) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return m.exitError(p)
		case <-ctx.Done():
			return fmt.Errorf("member %d (port %d) not ready: %w%s", m.id, m.port, ctx.Err(), m.logTail())
		case <-tick.C:
		}
		if b, err := os.ReadFile(m.logPath()); err == nil && bytes.Contains(b, []byte(`"Waiting for connections"`)) {
			return nil
		}
	}
}

// lockFile is the file in a dbpath that mongod holds an flock on while it runs.
const lockFile = "mongod.lock"

// checkUnlocked fails with errDBPathInUse if another process holds the lock
// of the member's data directory, as mongod would (it takes an exclusive
// flock on dbpath/mongod.lock).
func (m *Member) checkUnlocked() error {
	path := filepath.Join(m.dir, lockFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	err = syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		owner := "another process"
		if b, _ := os.ReadFile(path); len(bytes.TrimSpace(b)) > 0 {
			owner = "pid " + string(bytes.TrimSpace(b))
		}
		return &kindError{errDBPathInUse, fmt.Sprintf("member %d: %s is locked by %s "+
			"(another mongod? stop it or use another directory)", m.id, m.dir, owner), nil}
	}
	if err != nil {
		return fmt.Errorf("flock %s: %w", path, err)
	}
	return syscall.Flock(fd, syscall.LOCK_UN)
}

// exitError describes a mongod that exited while it was being started.
func (m *Member) exitError(p *process) error {
	b, _ := os.ReadFile(m.logPath())
	err := fmt.Errorf("mongod member %d (port %d, pid %d) exited during start: %v%s",
		m.id, m.port, p.cmd.Process.Pid, p.err, m.logTail())
	switch {
	case bytes.Contains(b, []byte("Address already in use")):
		return fmt.Errorf("%w: %w", errPortInUse, err)
	case bytes.Contains(b, []byte("Another mongod instance is already running")):
		return &kindError{errDBPathInUse, fmt.Sprintf("member %d: %s is locked by another mongod "+
			"(stop it or use another directory)", m.id, m.dir), err}
	}
	return err
}

// logTail returns the last lines of the member's log and output, for errors.
func (m *Member) logTail() string {
	var sb strings.Builder
	for _, path := range []string{m.logPath(), m.outputPath()} {
		b, err := os.ReadFile(path)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > logTailLines {
			lines = lines[len(lines)-logTailLines:]
		}
		fmt.Fprintf(&sb, "\n--- last %d lines of %s ---\n%s", len(lines), path, strings.Join(lines, "\n"))
	}
	return sb.String()
}

// helloReply is the part of the hello command's reply that is used here.
type helloReply struct {
	SetName           string `bson:"setName"`
	IsWritablePrimary bool   `bson:"isWritablePrimary"`
	Secondary         bool   `bson:"secondary"`
	Primary           string `bson:"primary"`
	Me                string `bson:"me"`
}

// directClient connects to the member alone (directConnection=true).
// The caller must Disconnect it.
func (m *Member) directClient() (*mongo.Client, error) {
	return mongo.Connect(options.Client().
		ApplyURI("mongodb://" + m.Addr() + "/?directConnection=true").
		SetTLSConfig(m.rs.tls).
		SetServerSelectionTimeout(2 * time.Second).
		SetConnectTimeout(2 * time.Second))
}

// hello runs the hello command on the member alone.
func (m *Member) hello(ctx context.Context) (helloReply, error) {
	var h helloReply
	c, err := m.directClient()
	if err != nil {
		return h, err
	}
	defer disconnect(c)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err = c.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&h)
	return h, err
}

// disconnect closes c. The server may be gone already, in which case
// Disconnect would wait for its whole timeout trying to end the sessions.
func disconnect(c *mongo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Disconnect(ctx)
}

// initiate runs replSetInitiate on member 0. It reports false (and no error)
// if member 0 already has a config, from an earlier start on the same Dir.
func (rs *ReplicaSet) initiate(ctx context.Context) (initiated bool, _ error) {
	members := bson.A{}
	for i, m := range rs.members {
		doc := bson.D{{Key: "_id", Value: i}, {Key: "host", Value: m.Addr()}}
		if i == 0 && len(rs.members) > 1 {
			doc = append(doc, bson.E{Key: "priority", Value: 2})
		}
		members = append(members, doc)
	}
	cfg := bson.D{{Key: "_id", Value: rs.name}, {Key: "members", Value: members}}
	if len(rs.members) > 1 {
		cfg = append(cfg, bson.E{Key: "settings", Value: bson.D{
			{Key: "electionTimeoutMillis", Value: 2000},
			{Key: "heartbeatIntervalMillis", Value: 500},
		}})
	}
	c, err := rs.members[0].directClient()
	if err != nil {
		return false, err
	}
	defer disconnect(c)
	for dropped := 0; ; {
		err = c.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetInitiate", Value: cfg}}).Err()
		var se mongo.ServerError
		var cleared driver.RetryablePoolError // the pool cleared by such a drop
		switch {
		case (mongo.IsNetworkError(err) || errors.As(err, &cleared)) && dropped < 20:
			// A member whose stored config does not name it closes its
			// connections as it changes state on start-up; ask again (it
			// then answers AlreadyInitialized, and checkConfig explains).
			dropped++
			rs.log.Debug("member 0 dropped the connection during replSetInitiate, retrying", "err", err)
		case mongo.IsTimeout(err) && ctx.Err() == nil:
			// Server selection gave up (a loaded machine can take longer
			// than its 2 s to answer the first hello); ask again until
			// the caller's deadline.
			rs.log.Debug("member 0 not selected for replSetInitiate, retrying", "err", err)
		case err == nil:
			rs.log.Debug("replSetInitiate done")
			return true, nil
		case errors.As(err, &se) && se.HasErrorCode(codeAlreadyInitialized):
			rs.log.Debug("replica set already initiated")
			return false, nil
		case errors.As(err, &se) && se.HasErrorCode(codeNotYetInitialized):
			// Still loading its config from an earlier start.
			rs.log.Debug("member 0 not ready for replSetInitiate, retrying", "err", err)
		default:
			return false, fmt.Errorf("replSetInitiate on %s: %w%s", rs.members[0].Addr(), err, rs.members[0].logTail())
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("replSetInitiate on %s: %w: %w", rs.members[0].Addr(), err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkConfig checks that the config of a set initiated before names this
// set and its members' hosts, which would otherwise never elect a primary.
func (rs *ReplicaSet) checkConfig(ctx context.Context) error {
	c, err := rs.members[0].directClient()
	if err != nil {
		return err
	}
	defer disconnect(c)
	var got struct {
		Config struct {
			ID      string `bson:"_id"`
			Members []struct {
				ID   int    `bson:"_id"`
				Host string `bson:"host"`
			} `bson:"members"`
		} `bson:"config"`
	}
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetGetConfig", Value: 1}}).Decode(&got); err != nil {
		return fmt.Errorf("replSetGetConfig on %s: %w", rs.members[0].Addr(), err)
	}
	var have, want []string
	for _, m := range got.Config.Members {
		have = append(have, strconv.Itoa(m.ID)+"="+m.Host)
	}
	slices.Sort(have)
	for i, m := range rs.members {
		want = append(want, strconv.Itoa(i)+"="+m.Addr())
	}
	slices.Sort(want)
	if got.Config.ID != rs.name || !slices.Equal(have, want) {
		return fmt.Errorf("%s holds replica set %q with members %v, not %q with members %v: "+
			"start it with the same ReplSet, Members and Ports, or use another directory",
			rs.dir, got.Config.ID, have, rs.name, want)
	}
	return nil
}

// stepUp makes m the primary: it asks m to stand for election
// (replSetStepUp) as soon as m is a secondary, instead of waiting for the
// election timeout, and again until m says it is the writable primary.
func (rs *ReplicaSet) stepUp(ctx context.Context, m *Member) error {
	c, err := m.directClient()
	if err != nil {
		return err
	}
	defer disconnect(c)
	admin := c.Database("admin")
	for {
		var h helloReply
		err := admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&h)
		switch {
		case err == nil && h.IsWritablePrimary:
			return nil
		case err == nil && h.Secondary:
			// Fails until enough members have the config to vote.
			err = admin.RunCommand(ctx, bson.D{{Key: "replSetStepUp", Value: 1}}).Err()
		case err == nil:
			err = errors.New("not yet a secondary")
		}
		if err != nil {
			rs.log.Debug("waiting to step up", "member", m.id, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("member %d did not become primary: %v: %w", m.id, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// resetPriority sets member 0's priority back to 1 once it is primary, so
// that later failovers are not undone by a priority takeover.
func (rs *ReplicaSet) resetPriority(ctx context.Context) error {
	c, err := rs.members[0].directClient()
	if err != nil {
		return err
	}
	defer disconnect(c)
	admin := c.Database("admin")
	var got struct {
		Config bson.D `bson:"config"`
	}
	if err := admin.RunCommand(ctx, bson.D{{Key: "replSetGetConfig", Value: 1}}).Decode(&got); err != nil {
		return fmt.Errorf("replSetGetConfig: %w", err)
	}
	cfg := got.Config
	for i, e := range cfg {
		switch e.Key {
		case "version":
			v, ok := asInt64(e.Value)
			if !ok {
				return fmt.Errorf("replSetGetConfig: version is %T", e.Value)
			}
			cfg[i].Value = v + 1
		case "members":
			ms, ok := e.Value.(bson.A)
			if !ok {
				return fmt.Errorf("replSetGetConfig: members is %T", e.Value)
			}
			for _, mv := range ms {
				md, ok := mv.(bson.D)
				if !ok {
					return fmt.Errorf("replSetGetConfig: member is %T", mv)
				}
				for j := range md {
					if md[j].Key == "priority" {
						md[j].Value = 1
					}
				}
			}
		}
	}
	// The reconfig can race with the end of the secondaries' initial sync;
	// retry transient failures until ctx ends.
	for {
		err := admin.RunCommand(ctx, bson.D{{Key: "replSetReconfig", Value: cfg}}).Err()
		if err == nil {
			return nil
		}
		rs.log.Debug("replSetReconfig failed, retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("replSetReconfig: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func asInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case float64:
		return int64(v), true
	}
	return 0, false
}

// createRoot makes Options.Root a root user on a fresh set (through the
// localhost exception: no user exists yet) and authenticates this
// package's later connections with it.
func (rs *ReplicaSet) createRoot(ctx context.Context, cred options.Credential, fresh bool) error {
	if fresh {
		c, err := mongo.Connect(options.Client().ApplyURI(rs.URI()).SetTLSConfig(rs.tls))
		if err != nil {
			return err
		}
		defer disconnect(c)
		err = c.Database("admin").RunCommand(ctx, bson.D{{Key: "createUser", Value: cred.Username}, {Key: "pwd", Value: cred.Password},
			{Key: "roles", Value: bson.A{bson.D{{Key: "role", Value: "root"}, {Key: "db", Value: "admin"}}}}}).Err()
		if err != nil {
			return fmt.Errorf("create the root user %s: %w", cred.Username, err)
		}
	}
	if cred.AuthSource == "" {
		cred.AuthSource = "admin"
	}
	rs.root = &cred
	return nil
}

// probeWrite checks that a majority write through the replica set URI works.
func (rs *ReplicaSet) probeWrite(ctx context.Context) error {
	o := options.Client().ApplyURI(rs.URI()).SetTLSConfig(rs.tls)
	if rs.root != nil {
		o.SetAuth(*rs.root)
	}
	c, err := mongo.Connect(o)
	if err != nil {
		return err
	}
	defer disconnect(c)
	db := c.Database(probeDatabase)
	coll := db.Collection("probe", options.Collection().SetWriteConcern(writeconcern.Majority()))
	for {
		err := func() error {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "probe"}}); err != nil {
				return err
			}
			if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "probe"}}); err != nil {
				return err
			}
			return db.Drop(ctx)
		}()
		if err == nil {
			return nil
		}
		rs.log.Debug("probe write failed, retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("majority write through %s: %w", rs.URI(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct loopback ports that were free just now.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeFileAtomic writes path via a temporary file and a rename, so that the
// watchdog never reads a half-written file.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
