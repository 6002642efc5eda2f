package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

// env is a run's MongoDB: a replica set it started or one given by URI,
// and a client for setting up and dropping databases.
type env struct {
	cfg     config
	log     *slog.Logger // progress
	nodeLog *slog.Logger // given to nodes: warnings only unless --verbose
	uri     string
	rs      *mongod.ReplicaSet
	client  *mongo.Client
	prefix  string
	seq     atomic.Int64
}

// setup starts the replica set (or connects to --mongo-uri).
func setup(ctx context.Context, cfg config, log *slog.Logger) (*env, error) {
	level := slog.LevelWarn
	if cfg.Verbose {
		level = slog.LevelInfo
	}
	e := &env{
		cfg:     cfg,
		log:     log,
		nodeLog: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		uri:     cfg.MongoURI,
		prefix:  "disbatch_bench_" + randHex(3),
	}
	if e.uri == "" {
		log.Info("starting a replica set", "members", cfg.Members, "cache_gb", cfg.CacheGB, "oplog_mib", cfg.OplogMiB)
		rsLog := slog.New(slog.DiscardHandler)
		if cfg.Verbose {
			rsLog = log
		}
		rs, err := mongod.StartReplicaSet(ctx, mongod.Options{
			Members: cfg.Members,
			Logger:  rsLog,
			ExtraArgs: []string{
				"--wiredTigerCacheSizeGB", strconv.FormatFloat(cfg.CacheGB, 'f', -1, 64),
				"--oplogSize", strconv.Itoa(cfg.OplogMiB),
			},
		})
		if err != nil {
			return nil, fmt.Errorf("%w (run `make mongod` first, or give --mongo-uri)", err)
		}
		e.rs, e.uri = rs, rs.URI()
	}
	c, err := e.connect()
	if err != nil {
		e.close()
		return nil, err
	}
	e.client = c
	if err := c.Ping(ctx, nil); err != nil {
		e.close()
		return nil, fmt.Errorf("ping %s: %w", redact(e.uri), err)
	}
	return e, nil
}

// connect returns a new client: each node, submitter and raw loop gets its
// own, as separate processes would have.
func (e *env) connect() (*mongo.Client, error) {
	c, err := mongo.Connect(options.Client().ApplyURI(e.uri))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(e.uri), err)
	}
	return c, nil
}

// disconnect closes a client, ignoring errors (the run is over for it).
func disconnect(c *mongo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.Disconnect(ctx)
}

// close disconnects and stops the replica set, if this run started it.
func (e *env) close() {
	if e.client != nil {
		disconnect(e.client)
	}
	if e.rs != nil {
		e.log.Info("stopping the replica set")
		if err := e.rs.Stop(); err != nil {
			e.log.Warn("stop the replica set", "error", err)
		}
	}
}

// database returns a fresh database for one measurement, and a function
// that drops it.
func (e *env) database(what string) (*mongo.Database, func()) {
	name := fmt.Sprintf("%s_%d_%s", e.prefix, e.seq.Add(1), what)
	if len(name) > 60 {
		name = name[:60]
	}
	db := e.client.Database(name)
	return db, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := db.Drop(ctx); err != nil {
			e.log.Warn("drop database", "db", name, "error", err)
		}
	}
}

// conditions describes what the figures were measured on.
func (e *env) conditions(ctx context.Context) Conditions {
	c := Conditions{
		Started:       time.Now().UTC(),
		Mode:          "default",
		Groups:        e.cfg.Only,
		GoVersion:     runtime.Version(),
		OSArch:        runtime.GOOS + "/" + runtime.GOARCH,
		NumCPU:        runtime.NumCPU(),
		GOMAXPROCS:    runtime.GOMAXPROCS(0),
		GC:            e.cfg.gc,
		Driver:        driverVersion(),
		MaxThreads:    e.cfg.MaxThreads,
		ClaimBatch:    e.cfg.ClaimBatch,
		ClaimLinger:   e.cfg.ClaimLinger.String(),
		ClaimRunning:  e.cfg.ClaimRunning,
		PreImagesIdle: e.cfg.PreImagesIdle.String(),
		WriteConcerns: "nodes, store and raw loops: majority; pickup submitter: majority and w:1 " +
			"(rows); throughput and scale inserts: majority",
		Deployment: "--mongo-uri " + redact(e.uri),
	}
	if e.cfg.Quick {
		c.Mode = "quick"
	}
	if e.rs != nil {
		c.Deployment = fmt.Sprintf("local replica set started by disbatch-bench (WiredTiger cache %g GB, oplog %d MiB)", e.cfg.CacheGB, e.cfg.OplogMiB)
	}
	var bi struct {
		Version string `bson:"version"`
	}
	if err := e.client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err != nil {
		e.log.Warn("buildInfo", "error", err)
	}
	c.MongoDBVersion = bi.Version
	c.Members = e.members(ctx)
	return c
}

// members counts the replica set's members: replSetGetStatus, or hello's
// hosts and passives when that is not allowed.
func (e *env) members(ctx context.Context) int {
	var st struct {
		Members []bson.Raw `bson:"members"`
	}
	if err := e.client.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetGetStatus", Value: 1}}).Decode(&st); err == nil {
		return len(st.Members)
	}
	var h struct {
		Hosts    []string `bson:"hosts"`
		Passives []string `bson:"passives"`
		Arbiters []string `bson:"arbiters"`
	}
	if err := e.client.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&h); err != nil {
		e.log.Warn("hello", "error", err)
		return 0
	}
	return len(h.Hosts) + len(h.Passives) + len(h.Arbiters)
}

// driverVersion is the MongoDB Go driver's module version.
func driverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "go.mongodb.org/mongo-driver/v2" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// redact removes a password from a URI.
func redact(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		if i := strings.LastIndex(uri, "@"); i >= 0 {
			return "mongodb://…" + uri[i:]
		}
		return uri
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
