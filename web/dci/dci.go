// Package dci serves the Disbatch Command Interface: the HTTP API of
// Disbatch 4.103's Disbatch::Web, answering what its clients parse (the
// bin/disbatch CLI, its web page, monitoring probes, sites' scripts) byte
// for byte. ../shared/DISBATCH-4.103-WEB-API.md is the route-by-route
// account it follows; the golden tests encode what the real 4.103 server
// answered.
//
// Where 4.103 has plain bugs (a Perl reference address as an error, a 500
// on bad input) this package answers sanely in the same shape: a 400 with
// an "error" string. Data stays in this project's model: queues created
// here carry both dialects' field names, tasks the 4.103 shape, so both
// kinds of node run them. Queue counts come from the projected counters
// plus one aggregation over running tasks, never from count queries per
// queue.
package dci

import (
	"context"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the routes need of the store.
type Store interface {
	NodeDocs(ctx context.Context) ([]bson.Raw, error)
	NodeDoc(ctx context.Context, ref string) (bson.Raw, error)
	NodeMaxThreadsSet(ctx context.Context, p store.NodeMaxThreadsSetParams) (store.WriteCounts, error)
	QueueDocs(ctx context.Context) ([]bson.Raw, error)
	QueueResolve(ctx context.Context, ref string) (bson.ObjectID, error)
	QueueCreate(ctx context.Context, p store.QueueCreateParams) (schema.Queue, error)
	QueueSet(ctx context.Context, p store.QueueSetParams) (store.WriteCounts, error)
	QueueDocDelete(ctx context.Context, ref string) (store.WriteCounts, error)
	QueueStatusCounts(ctx context.Context, queue bson.ObjectID) (queued, running, completed int64, err error)
	TaskRunningCounts(ctx context.Context) (map[bson.ObjectID]int64, error)
	TaskInsertMany(ctx context.Context, p store.TaskInsertManyParams) ([]bson.ObjectID, error)
	TaskFind(ctx context.Context, p store.TaskFindParams) ([]bson.Raw, error)
	TaskCount(ctx context.Context, filter bson.D, skip, limit int64) (int64, error)
	TaskIndexKeys(ctx context.Context) ([]store.TaskIndex, error)
	TaskOutputRead(ctx context.Context, o schema.Output) (string, error)
	DocumentsFind(ctx context.Context, p store.DocumentsFindParams) ([]bson.Raw, error)
	BalanceGet(ctx context.Context) (bson.Raw, error)
	BalanceSet(ctx context.Context, set bson.D) error
	ServerNow(ctx context.Context) (time.Time, error)
}

// LegacyTasksExtension is the name /info lists when Options.LegacyTasks
// mounts the deprecated routes.
const LegacyTasksExtension = "Disbatch::Web::Tasks"

// DefaultMaxCollectionTasks bounds the tasks one POST /tasks may make from
// the documents of a collection.
const DefaultMaxCollectionTasks = 1_000_000

// Options configure the routes.
type Options struct {
	Store Store
	// Database is the database's name (GET /info, error messages).
	Database string
	// Plugins are the plugin names GET /plugins answers and POST /queues
	// accepts.
	Plugins []string
	// LegacyTasks mounts Disbatch::Web::Tasks (deprecated in 4.2): POST
	// /tasks/search, /tasks/:queue and /tasks/:queue/:collection (the
	// first two one route, as in 4.103).
	LegacyTasks bool
	// Monitoring turns GET /monitoring's node check on (4.103's
	// "monitoring" setting).
	Monitoring bool
	// Balance is 4.103's "balance" setting, which GET /balance shows and
	// whose "enabled" GET /monitoring reads; nil: DefaultBalance(false).
	Balance map[string]any
	// WebRoot, when set, is the folder GET of any other path serves files
	// from (4.103's web_root, e.g. its etc/disbatch/htdocs).
	WebRoot string
	// MaxCollectionTasks: see DefaultMaxCollectionTasks.
	MaxCollectionTasks int64
	Logger             *slog.Logger
}

// DefaultBalance is 4.103's "balance" setting as its example
// configuration has it (QueueBalance's own daemon is not part of this
// project: the setting is shown, and enabled makes /monitoring check it).
func DefaultBalance(enabled bool) map[string]any {
	e := 0
	if enabled {
		e = 1
	}
	return map[string]any{"enabled": e, "log": 1, "pretend": 0, "verbose": 0}
}

// Handler serves the routes.
type Handler struct {
	o      Options
	log    *slog.Logger
	routes []route
}

// route is one of 4.103's routes: matched in registration order by method
// and a regular expression on the path, the first match winning.
type route struct {
	method  string
	pattern string // as 4.103's GET /info lists it
	re      *regexp.Regexp
	fn      func(w http.ResponseWriter, r *http.Request, m map[string]string)
}

// New returns the handler.
func New(o Options) *Handler {
	h := &Handler{o: o, log: o.Logger}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.o.Balance == nil {
		h.o.Balance = DefaultBalance(false)
	}
	if h.o.MaxCollectionTasks <= 0 {
		h.o.MaxCollectionTasks = DefaultMaxCollectionTasks
	}
	// In 4.103's order (GET /info lists them so).
	h.add("GET", "/", "", h.index)
	h.add("GET", "/info", "", h.info)
	h.add("GET", "/nodes", "", h.nodes)
	h.add("GET", "", `^/nodes/(?<node>.+)`, h.node)
	h.add("POST", "", `^/nodes/(?<node>.+)`, h.nodeSet)
	h.add("GET", "/plugins", "", h.plugins)
	h.add("GET", "/queues", "", h.queues)
	h.add("GET", "", `^/queues/(?<queue>.+)$`, h.queue)
	h.add("POST", "/queues", "", h.queueCreate)
	h.add("POST", "", `^/queues/(?<queue>.+)$`, h.queueSet)
	h.add("DELETE", "", `^/queues/(?<queue>.+)$`, h.queueDelete)
	h.add("POST", "/tasks", "", h.tasksCreate)
	h.add("GET", "/tasks", "", h.tasksQuery)
	h.add("GET", "", `^/tasks/(?<id>[0-9a-f]{24})$`, h.task)
	h.add("GET", "/balance", "", h.balance)
	h.add("POST", "/balance", "", h.balanceSet)
	h.add("GET", "/monitoring", "", h.monitoring)
	if o.LegacyTasks {
		// 4.103 routes /tasks/search through this pattern too (queue "search").
		h.add("POST", "", `^/tasks/(?<queue>[^/]+)$`, h.legacyCreate)
		h.add("POST", "", `^/tasks/(?<queue>.+?)/(?<collection>.+)$`, h.legacyCreateFromCollection)
	}
	h.add("GET", "", `^/`, h.static)
	return h
}

func (h *Handler) add(method, literal, re string, fn func(http.ResponseWriter, *http.Request, map[string]string)) {
	rt := route{method: method, fn: fn}
	if literal != "" {
		rt.pattern = literal
	} else {
		// Written as Perl writes it; Go's regexp reads (?<name>) too.
		rt.re = regexp.MustCompile(re)
		rt.pattern = "(?^u:" + re + ")"
	}
	h.routes = append(h.routes, rt)
}

func (rt route) match(method, path string) (map[string]string, bool) {
	if rt.method != method && (method != http.MethodHead || rt.method != http.MethodGet) {
		return nil, false
	}
	if rt.re == nil {
		return nil, path == rt.pattern
	}
	m := rt.re.FindStringSubmatch(path)
	if m == nil {
		return nil, false
	}
	out := map[string]string{}
	for i, name := range rt.re.SubexpNames() {
		if name != "" {
			out[name] = m[i]
		}
	}
	return out, true
}

// ServeHTTP dispatches to the first matching route; nothing matched is a
// plain 404, as Limper answers.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	for _, rt := range h.routes {
		if m, ok := rt.match(r.Method, path); ok {
			rt.fn(w, r, m)
			return
		}
	}
	notFound(w)
}

func notFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte("This is the void"))
}

// send writes v as 4.103's JSON.
func send(w http.ResponseWriter, status int, v any, pretty bool) {
	body := encodeJSON(v, pretty)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (h *Handler) dbError(r *http.Request, what string, err error) {
	if r.Context().Err() == nil {
		h.log.Warn("dci: "+what, "path", r.URL.Path, "error", err)
	}
}

// errText is what an error says to a client: never a URI or a credential
// (store errors carry neither), with the store's wrapping kept.
func errText(err error) string {
	s := err.Error()
	return strings.TrimSpace(s)
}

// Route names the route a request for method and path matches, as GET
// /info lists it ("unmatched" when none does), for metrics and logs.
func (h *Handler) Route(method, path string) string {
	for _, rt := range h.routes {
		if _, ok := rt.match(method, path); ok {
			return rt.pattern
		}
	}
	return "unmatched"
}
