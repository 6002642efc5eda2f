package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// A node's transactions (capped claims, admission releases, the leader's
// sweeps) run in sessions recorded under the node's name. A transaction
// outlives a process killed in its middle: the server keeps it open, with
// the write locks it took (a capped queue's document, the tasks it was
// claiming), until its transactionLifetimeLimitSeconds (60 by default),
// and every other node's claim of that queue meets a write conflict until
// then. Whoever can tell that the process is gone kills its recorded
// sessions, which aborts such a transaction at once: the node's next run
// when it starts (NodeSessionsKillForget), and the leader when it finds the
// node dead (NodesDeadRecover).

// CollSessions records the sessions of nodes' transactions:
// {_id: the session id's UUID, lsid: the session id, node, ctime}.
const CollSessions = "disbatch_sessions"

// sessionIdle: a pooled session unused for longer is ended rather than
// reused, well within the server's 30 minutes after which it forgets an
// idle session.
const sessionIdle = 10 * time.Minute

// sessionPool holds a node's recorded sessions not in use. A recorded
// session is never given back to the driver's pool, which would reuse its
// id for other operations that a kill of the record would kill: it is
// retired (retireSessions) once its record is gone.
type sessionPool struct {
	node  string
	mu    sync.Mutex
	idle  []pooledSession // oldest first
	ended bool            // EndSessions: sessions given back are ended
}

type pooledSession struct {
	sess *mongo.Session
	used time.Time
}

// ForNode returns a Store for node's own use: its transactions run in
// sessions recorded under the node's name (see CollSessions), so that a
// transaction a crash leaves open can be killed. The Store shares
// everything else with s. OpenSessions and EndSessions bracket a run.
func (s *Store) ForNode(node string) *Store {
	c := *s
	c.pool = &sessionPool{node: node}
	return &c
}

// pooledTxnSession is a recorded session for a transaction, and the
// function that gives it back (broken: the transaction failed, and the
// session is ended rather than reused).
func (s *Store) pooledTxnSession(ctx context.Context) (*mongo.Session, func(broken bool), error) {
	p := s.pool
	now := time.Now()
	p.mu.Lock()
	// Sessions idle too long are ended, oldest first, wherever they are.
	k := 0
	for k < len(p.idle) && now.Sub(p.idle[k].used) > sessionIdle {
		k++
	}
	stale := slices.Clone(p.idle[:k])
	p.idle = p.idle[k:]
	var ps pooledSession
	if n := len(p.idle); n > 0 {
		ps, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	s.endPooled(ctx, stale)
	if ps.sess != nil {
		return ps.sess, func(broken bool) { s.giveBack(ctx, ps, broken) }, nil
	}
	sess, err := s.db.Client().StartSession()
	if err != nil {
		return nil, nil, fmt.Errorf("start the session of a transaction: %w", err)
	}
	lsid := sess.ID()
	if _, err := s.db.Collection(CollSessions).InsertOne(ctx, bson.D{
		{Key: "_id", Value: lsid.Lookup("id")}, {Key: "lsid", Value: lsid}, {Key: "node", Value: p.node}, {Key: "ctime", Value: s.nowMS()},
	}); err != nil {
		// Perhaps recorded all the same (the answer was lost): the
		// session is dropped, never ended, so no one else gets its id.
		return nil, nil, fmt.Errorf("record the session of a transaction: %w", err)
	}
	ps = pooledSession{sess: sess}
	return sess, func(broken bool) { s.giveBack(ctx, ps, broken) }, nil
}

// giveBack returns a session to the pool, or ends it when it is broken or
// the pool has ended.
func (s *Store) giveBack(ctx context.Context, ps pooledSession, broken bool) {
	p := s.pool
	p.mu.Lock()
	if !broken && !p.ended {
		ps.used = time.Now()
		p.idle = append(p.idle, ps)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	s.endPooled(ctx, []pooledSession{ps})
}

// endPooled removes the sessions' records, then retires them (see
// retireSessions). A session whose record may remain (the delete failed)
// is dropped as it is: the server forgets it after 30 idle minutes.
func (s *Store) endPooled(ctx context.Context, ss []pooledSession) {
	if len(ss) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ids := make(bson.A, len(ss))
	sessions := make([]*mongo.Session, len(ss))
	for i, ps := range ss {
		ids[i] = ps.sess.ID().Lookup("id")
		sessions[i] = ps.sess
	}
	if _, err := s.db.Collection(CollSessions).DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}); err != nil {
		return
	}
	s.retireSessions(ctx, sessions...)
}

// retireSessions ends sessions whose ids were recorded for others to kill
// (a node's, a lease term's) without ever giving the ids back to the
// driver: EndSession would, and the driver hands a pooled id to this
// process's next operations. A kill that read the record before it was
// removed can arrive after that, and would interrupt an unrelated
// operation ("operation was interrupted"). So the sessions are killed
// here (which aborts a transaction left open and frees its locks, as
// EndSession's abort would) and then dropped: the server forgets a killed
// session, and the driver never sees the id again.
func (s *Store) retireSessions(ctx context.Context, sessions ...*mongo.Session) {
	lsids := make(bson.A, len(sessions))
	for i, sess := range sessions {
		lsids[i] = sess.ID()
	}
	// A kill refused (another user's session, without killAnySession) or
	// lost leaves a session the server forgets after 30 idle minutes and
	// a transaction it aborts at its lifetime limit.
	_ = s.db.Client().Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: lsids}}).Err()
}

// OpenSessions lets a Store from ForNode pool its sessions again after an
// EndSessions: for a node's (re)start. Nothing for other Stores.
func (s *Store) OpenSessions() {
	if p := s.pool; p != nil {
		p.mu.Lock()
		p.ended = false
		p.mu.Unlock()
	}
}

// EndSessions ends the sessions of a Store from ForNode and removes their
// records; sessions in use are ended when given back. For the node's
// stop, after its last transaction. Nothing for other Stores.
func (s *Store) EndSessions(ctx context.Context) {
	p := s.pool
	if p == nil {
		return
	}
	p.mu.Lock()
	p.ended = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	s.endPooled(ctx, idle)
}

// NodeSessionsKill kills the sessions recorded under node: a transaction
// one of them left open is aborted and its locks freed. For the leader,
// about a node it finds dead (perhaps wrongly: a live node's killed
// transaction is retried, and its sessions, still recorded, serve on). It
// returns how many sessions were recorded. A session this user may not
// kill (another user's, without the killAnySession privilege) is left to
// the server's transaction lifetime, as before sessions were recorded.
func (s *Store) NodeSessionsKill(ctx context.Context, node string) (int, error) {
	_, n, err := s.nodeSessionsKill(ctx, node)
	return n, err
}

// NodeSessionsKillForget kills the sessions recorded under node, as
// NodeSessionsKill, and removes their records: for the node's own start,
// about its previous run's sessions (that process is gone, so no one uses
// their ids). Call it before the run's first transaction.
func (s *Store) NodeSessionsKillForget(ctx context.Context, node string) (int, error) {
	ids, n, err := s.nodeSessionsKill(ctx, node)
	if err != nil || n == 0 {
		return n, err
	}
	if _, err := s.db.Collection(CollSessions).DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}); err != nil {
		return n, fmt.Errorf("forget the sessions of node %q: %w", node, err)
	}
	return n, nil
}

func (s *Store) nodeSessionsKill(ctx context.Context, node string) (ids bson.A, n int, err error) {
	cur, err := s.db.Collection(CollSessions).Find(ctx, bson.D{{Key: "node", Value: node}},
		options.Find().SetProjection(bson.D{{Key: "lsid", Value: 1}}))
	if err != nil {
		return nil, 0, fmt.Errorf("read the sessions of node %q: %w", node, err)
	}
	var recs []struct {
		ID   bson.RawValue `bson:"_id"`
		LSID bson.Raw      `bson:"lsid"`
	}
	if err := readAllInto(ctx, cur, &recs); err != nil {
		return nil, 0, fmt.Errorf("read the sessions of node %q: %w", node, err)
	}
	if len(recs) == 0 {
		return nil, 0, nil
	}
	lsids := bson.A{}
	for _, r := range recs {
		lsids = append(lsids, r.LSID)
		ids = append(ids, r.ID)
	}
	var ce mongo.CommandError
	if err := s.db.Client().Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: lsids}}).Err(); err != nil &&
		!(errors.As(err, &ce) && ce.Code == 13) { // 13: Unauthorized
		return ids, len(recs), fmt.Errorf("kill the sessions of node %q: %w", node, err)
	}
	return ids, len(recs), nil
}
