package apiv1

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the API reads and writes; *store.Store is one.
type Store interface {
	QueueList(ctx context.Context) (store.QueueListResult, error)
	QueueNamed(ctx context.Context, name string) (bool, error)
	QueueGet(ctx context.Context, p store.QueueGetParams) (schema.Queue, error)
	QueueCreate(ctx context.Context, p store.QueueCreateParams) (schema.Queue, error)
	QueueModify(ctx context.Context, p store.QueueUpdateParams) (schema.Queue, error)
	QueueDelete(ctx context.Context, p store.QueueDeleteParams) (store.QueueDeleteResult, error)
	TaskRunningCounts(ctx context.Context) (map[bson.ObjectID]int64, error)
	TaskInsertMany(ctx context.Context, p store.TaskInsertManyParams) ([]bson.ObjectID, error)
	TaskInsertGraph(ctx context.Context, p store.TaskInsertGraphParams) ([]bson.ObjectID, error)
	TaskGraphGet(ctx context.Context, p store.TaskGraphGetParams) (store.TaskGraphView, error)
	TaskSearch(ctx context.Context, p store.TaskSearchParams) (store.TaskSearchResult, error)
	TaskOutputOpen(ctx context.Context, p store.TaskOutputOpenParams) (*store.TaskOutput, error)
	NodeList(ctx context.Context) (store.NodeListResult, error)
	NodeDoc(ctx context.Context, ref string) (bson.Raw, error)
	NodeMaxThreadsSet(ctx context.Context, p store.NodeMaxThreadsSetParams) (store.WriteCounts, error)
	NodeDrain(ctx context.Context, p store.NodeDrainParams) (schema.Node, error)
	ServerNow(ctx context.Context) (time.Time, error)
	LeaseGet(ctx context.Context, name string) (store.Lease, error)
	// Task control (control.go, wait.go).
	TaskKill(ctx context.Context, p store.TaskKillParams) (store.TaskKillResult, error)
	TaskCancel(ctx context.Context, p store.TaskCancelParams) (store.TaskCancelResult, error)
	TaskRetry(ctx context.Context, p store.TaskRetryParams) (store.TaskRetryResult, error)
	TaskStates(ctx context.Context, ids []bson.ObjectID) ([]store.TaskState, error)
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
}

// DefaultMaxBodyBytes bounds a request body by default: room for 10,000
// tasks with a few KiB of parameters each.
const DefaultMaxBodyBytes = 32 << 20

// Options configure the handler.
type Options struct {
	Store Store
	// Plugins are the plugin names a queue may be created with (or
	// changed to); empty: any name. When set, the OpenAPI document lists
	// them as the enum of plugin.
	Plugins []string
	// Dialect4103 writes submitted tasks as Disbatch 4.103 does (params,
	// node null), for databases shared with 4.103's Perl nodes; this
	// project's nodes read both.
	Dialect4103 bool
	// Events serves GET /api/v1/events (web/live's hub); nil: the route
	// is not mounted and the OpenAPI document leaves it out.
	Events       http.Handler
	MaxBodyBytes int64 // default DefaultMaxBodyBytes
	Logger       *slog.Logger
	// Clock times requests for the debug log (default: the real clock).
	Clock clock.Clock
	// Controlled, when set, is told how many tasks each kill, cancel or
	// retry changed, by action (the Action constants); a dry run changes
	// none. web counts them in disbatch_web_task_control_total.
	Controlled func(action string, tasks int64)
}

type handler struct {
	st      Store
	plugins []string
	dialect bool
	maxBody int64
	log     *slog.Logger
	clock   clock.Clock
	// controlled: Options.Controlled, never nil.
	controlled func(action string, tasks int64)
	doc        []byte
	routes     *http.ServeMux
	// paths answers, for a request no route matched, whether its path is
	// one of the routes' (then 405, with allow[pattern] in Allow) or not
	// (404).
	paths *http.ServeMux
	allow map[string][]string
}

// route is one operation: its method and full path as in the OpenAPI
// document, and the query parameters it takes (deep: the name of a
// deepObject one, deep[key]=value; anyQuery: the handler checks its own).
type route struct {
	method, path string
	query        []string
	deep         string
	anyQuery     bool
	serve        func(w http.ResponseWriter, r *http.Request) error
}

// New returns the handler of the v1 API. It serves full paths under
// /api/v1/ (mount it there); every other path under /api/v1/ is a 404 in
// the v1 error shape.
func New(o Options) http.Handler {
	h := newHandler(o)
	doc, err := document(o.Plugins, o.Events != nil)
	if err != nil {
		panic("apiv1: the embedded OpenAPI document: " + err.Error()) // a build defect, caught by the tests
	}
	h.doc = doc
	h.mount(h.routeTable(o.Events), "no route %s in the v1 API; see /api/v1/openapi.json")
	return h
}

func newHandler(o Options) *handler {
	h := &handler{
		st:         o.Store,
		plugins:    o.Plugins,
		dialect:    o.Dialect4103,
		maxBody:    o.MaxBodyBytes,
		log:        o.Logger,
		clock:      clock.Or(o.Clock),
		controlled: o.Controlled,
		routes:     http.NewServeMux(),
		paths:      http.NewServeMux(),
		allow:      map[string][]string{},
	}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.controlled == nil {
		h.controlled = func(string, int64) {}
	}
	return h
}

// mount registers the routes, a 405 (with Allow) for the other methods on
// their paths, and a 404 (notFound: a format for the path) for all else.
func (h *handler) mount(rts []route, notFound string) {
	for _, rt := range rts {
		h.routes.Handle(rt.method+" "+rt.path, h.wrap(rt))
		if _, ok := h.allow[rt.path]; !ok {
			h.paths.HandleFunc(rt.path, h.notAllowed(rt.path))
		}
		h.allow[rt.path] = append(h.allow[rt.path], rt.method)
		if rt.method == http.MethodGet {
			h.allow[rt.path] = append(h.allow[rt.path], http.MethodHead)
		}
	}
	// A literal path that a pattern of another method also matches
	// (GET /api/v1/tasks/kill and GET /api/v1/tasks/{id}) is that path's
	// with a method it does not take: 405, not the other route.
	for p, allowed := range h.allow {
		if strings.Contains(p, "{") {
			continue
		}
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if slices.Contains(allowed, m) {
				continue
			}
			if _, pattern := h.routes.Handler(&http.Request{Method: m, URL: &url.URL{Path: p}}); pattern != "" {
				h.routes.HandleFunc(m+" "+p, h.notAllowed(p))
			}
		}
	}
	h.paths.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf(notFound, r.URL.Path), "")
	})
	h.routes.Handle("/", h.paths)
}

// Route names the route a request matches, for metrics and logs: its
// pattern ("GET /api/v1/tasks/{id}"), or "unmatched". A handler of New or
// NewScheduler has it (web asks through an interface).
func (h *handler) Route(r *http.Request) string {
	if _, pattern := h.routes.Handler(r); pattern != "" && pattern != "/" {
		return pattern
	}
	return "unmatched"
}

func (h *handler) notAllowed(pattern string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		allowed := h.allow[pattern]
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		WriteError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" is not allowed on "+pattern+"; allowed: "+strings.Join(allowed, ", "), "")
	}
}

func (h *handler) routeTable(events http.Handler) []route {
	rts := []route{
		{method: "GET", path: "/api/v1/openapi.json", serve: h.openAPI},
		{method: "GET", path: "/api/v1/queues", serve: h.queueList},
		{method: "POST", path: "/api/v1/queues", serve: h.queueCreate},
		{method: "GET", path: "/api/v1/queues/{queue}", serve: h.queueGet},
		{method: "PATCH", path: "/api/v1/queues/{queue}", serve: h.queuePatch},
		{method: "DELETE", path: "/api/v1/queues/{queue}", query: []string{"force"}, serve: h.queueDelete},
		{method: "GET", path: "/api/v1/tasks", query: []string{"queue", "status", "reason", "node", "created_after", "created_before", "order", "limit", "cursor"}, deep: "param", serve: h.taskList},
		{method: "POST", path: "/api/v1/tasks", serve: h.taskSubmit},
		{method: "POST", path: "/api/v1/tasks/kill", serve: h.taskKillMany},
		{method: "POST", path: "/api/v1/tasks/cancel", serve: h.taskCancelMany},
		{method: "POST", path: "/api/v1/tasks/retry", serve: h.taskRetryMany},
		{method: "GET", path: "/api/v1/tasks/wait", query: []string{"id", "timeout"}, serve: h.taskWait},
		{method: "GET", path: "/api/v1/tasks/{id}", serve: h.taskGet},
		{method: "POST", path: "/api/v1/tasks/{id}/kill", serve: h.taskKill},
		{method: "POST", path: "/api/v1/tasks/{id}/cancel", serve: h.taskCancel},
		{method: "POST", path: "/api/v1/tasks/{id}/retry", serve: h.taskRetry},
		{method: "GET", path: "/api/v1/tasks/{id}/stdout", serve: h.taskOutput(schema.TaskStdout)},
		{method: "GET", path: "/api/v1/tasks/{id}/stderr", serve: h.taskOutput(schema.TaskStderr)},
		{method: "GET", path: "/api/v1/tasks/{id}/graph", serve: h.taskGraph},
		{method: "GET", path: "/api/v1/nodes", serve: h.nodeList},
		{method: "GET", path: "/api/v1/nodes/{node}", serve: h.nodeGet},
		{method: "PATCH", path: "/api/v1/nodes/{node}", serve: h.nodePatch},
		{method: "POST", path: "/api/v1/nodes/{node}/drain", serve: h.nodeDrain},
		{method: "GET", path: "/api/v1/cluster", serve: h.cluster},
	}
	if events != nil {
		// The hub checks its own parameters (and ignores unknown ones).
		rts = append(rts, route{method: "GET", path: "/api/v1/events", anyQuery: true, serve: func(w http.ResponseWriter, r *http.Request) error {
			events.ServeHTTP(w, r)
			return nil
		}})
	}
	return rts
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := h.clock.Now()
	rec := &statusWriter{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			h.log.Error("api handler panicked", "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
			if rec.status == 0 {
				WriteError(rec, http.StatusInternalServerError, CodeInternal, "internal error; the server's log has the details", "")
			}
		}
		h.log.Debug("api request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "duration", h.clock.Since(start))
	}()
	h.routes.ServeHTTP(rec, r)
}

// statusWriter remembers the status written, and passes Flush on (the
// event stream needs it).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// wrap checks the query's parameter names, then runs the route and writes
// the error it returns.
func (h *handler) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkQuery(r.URL, rt); err != nil {
			h.fail(w, r, err)
			return
		}
		if err := rt.serve(w, r); err != nil {
			h.fail(w, r, err)
		}
	})
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var de *schema.DecodeError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &de):
		h.log.Warn("a stored document cannot be read", "method", r.Method, "path", r.URL.Path, "error", err)
		ae = errorf(http.StatusInternalServerError, CodeMalformedDocument, "", "a stored document cannot be read: %v", de)
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		return // the client went away
	default:
		h.log.Error("api request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		ae = errorf(http.StatusInternalServerError, CodeInternal, "", "internal error; the server's log has the details")
	}
	WriteError(w, ae.status, ae.code, ae.msg, ae.field)
}

// checkQuery refuses a query the route does not take: an unknown
// parameter, a parameter given twice that takes one value, or text that
// is not UTF-8.
func checkQuery(u *url.URL, rt route) *apiError {
	if rt.anyQuery {
		return nil
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return errorf(http.StatusBadRequest, CodeInvalidParameter, "", "the query string cannot be parsed: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if !utf8.ValidString(name) {
			return errorf(http.StatusBadRequest, CodeUnknownParameter, "", "a query parameter's name is not UTF-8")
		}
		for _, v := range q[name] {
			if !utf8.ValidString(v) {
				return errorf(http.StatusBadRequest, CodeInvalidParameter, name, "the value is not UTF-8")
			}
		}
		if rt.deep != "" && strings.HasPrefix(name, rt.deep+"[") {
			continue // checked by the route
		}
		if !slices.Contains(rt.query, name) {
			if len(rt.query) == 0 {
				return errorf(http.StatusBadRequest, CodeUnknownParameter, name, "unknown query parameter %q: this route takes none", name)
			}
			return errorf(http.StatusBadRequest, CodeUnknownParameter, name, "unknown query parameter %q; the parameters are %s", name, strings.Join(rt.query, ", "))
		}
	}
	return nil
}

// oneParam returns a query parameter given at most once.
func oneParam(q url.Values, name string) (string, bool, *apiError) {
	vs, ok := q[name]
	if !ok {
		return "", false, nil
	}
	if len(vs) > 1 {
		return "", false, errorf(http.StatusBadRequest, CodeInvalidParameter, name, "give %s once", name)
	}
	return vs[0], true, nil
}

var objectIDPattern = regexp.MustCompile(`^[0-9a-f]{24}$`)

// objectID parses an id in a path or query parameter: 24 lower-case hex
// digits.
func objectID(s, field string) (bson.ObjectID, *apiError) {
	if !objectIDPattern.MatchString(s) {
		return bson.ObjectID{}, errorf(http.StatusBadRequest, CodeInvalidParameter, field, "want an ObjectId as 24 lower-case hex digits, got %q", clip(s))
	}
	id, err := bson.ObjectIDFromHex(s)
	if err != nil {
		return bson.ObjectID{}, errorf(http.StatusBadRequest, CodeInvalidParameter, field, "want an ObjectId as 24 lower-case hex digits, got %q", clip(s))
	}
	return id, nil
}

// clip shortens what a client sent for an error message.
func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	cut := 61
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// writeJSON writes a 2xx response.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

func (h *handler) openAPI(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(h.doc)
	return nil
}
