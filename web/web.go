// Package web is the HTTP face of disbatch: one http.Handler, mountable in
// any Go program, that serves
//
//   - the live dashboard (web/ui) at / and /ui/, and at /balance for
//     browsers (its balance editor);
//   - the Disbatch 4.103 command interface (web/dci) at the root, answering
//     what 4.103's CLI, web page and scripts parse (its queue browser
//     page is /index.html);
//   - the v1 JSON API (web/apiv1) under /api/v1, with its OpenAPI document
//     at /api/v1/openapi.json and live events (web/live) at /api/v1/events;
//   - seed 002's scheduler routes, PUT /v1/scheduler/kill and GET
//     /v1/scheduler/wait (apiv1.NewScheduler), which no 4.103 route
//     matches;
//   - Prometheus metrics of its requests, and of the tasks its control
//     requests changed, at /metrics.
//
// Authentication (web/auth) wraps everything but /metrics when users are
// given. cmd/disbatch-web is a thin main around it.
package web

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/apiv1"
	"github.com/disbatch-go/disbatch/web/auth"
	"github.com/disbatch-go/disbatch/web/dci"
	"github.com/disbatch-go/disbatch/web/ui"
)

// DefaultMaxBodyBytes bounds a request body: room for 10,000 tasks.
const DefaultMaxBodyBytes = 32 << 20

// Options configure the handler.
type Options struct {
	Store *store.Store
	// Database is the database's name, as GET /info answers it.
	Database string
	// Plugins: what GET /plugins answers and queue creation accepts.
	Plugins []string
	// LegacyTasks mounts 4.103's deprecated Disbatch::Web::Tasks routes.
	LegacyTasks bool
	// Monitoring and Balance are 4.103's settings of those names.
	Monitoring bool
	Balance    map[string]any
	// WebRoot is a folder of static files (4.103's htdocs) served at /
	// (its index.html at /index.html: / is the dashboard).
	WebRoot string
	// JaegerURL links the dashboard's tasks to their traces there.
	JaegerURL string
	// Users turns authentication on; nil: every request is allowed.
	Users *auth.Users
	// LocalOnly answers only requests whose Host names the loopback
	// (localhost, 127.0.0.0/8, [::1]): for a server without Users that
	// listens on the loopback, which a web page could otherwise reach by
	// DNS rebinding. Its callers set it with Users nil and a Loopback
	// address.
	LocalOnly bool
	// TrustedOrigins may write through a browser though they are not the
	// Host the server sees (a plain-HTTP proxy in front that passes its
	// own): scheme://host[:port] each (CheckOrigin).
	TrustedOrigins []string
	// Events serves GET /api/v1/events (web/live); nil: not mounted.
	Events       http.Handler
	MaxBodyBytes int64
	// Registry gets the request metrics; nil: a registry of its own.
	Registry *prometheus.Registry
	Logger   *slog.Logger
	Clock    clock.Clock
}

// NewHandler returns the handler.
func NewHandler(o Options) http.Handler {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := newMetrics(reg)

	legacy := dci.New(dci.Options{
		Store: o.Store, Database: o.Database, Plugins: o.Plugins, LegacyTasks: o.LegacyTasks,
		Monitoring: o.Monitoring, Balance: o.Balance, WebRoot: o.WebRoot, Logger: log.With("component", "dci"),
	})
	v1o := apiv1.Options{
		Store: o.Store, Plugins: o.Plugins, Logger: log.With("component", "apiv1"), Clock: o.Clock,
		MaxBodyBytes: o.MaxBodyBytes, Events: o.Events, Controlled: m.controlled,
	}
	v1 := apiv1.New(v1o)
	scheduler := apiv1.NewScheduler(v1o)

	mux := http.NewServeMux()
	mux.Handle("/api/v1/", auth.MiddlewareOnDeny(o.Users, auth.RequiredRole, apiv1.Deny, limitBody(o.MaxBodyBytes, true, v1)))
	// Exactly these paths: the rest of /v1/ stays 4.103's (its static files).
	for _, p := range apiv1.SchedulerPaths {
		mux.Handle(p, auth.MiddlewareOnDeny(o.Users, auth.RequiredRole, apiv1.Deny, limitBody(o.MaxBodyBytes, true, scheduler)))
	}
	legacyAuth := auth.Middleware(o.Users, auth.RequiredRole, limitBody(o.MaxBodyBytes, false, legacy))
	mux.Handle("/", legacyAuth)
	dash := auth.Middleware(o.Users, auth.RequiredRole, ui.New(ui.Options{JaegerURL: o.JaegerURL, Auth: o.Users != nil}))
	mux.Handle("GET /{$}", dash)
	mux.Handle("GET /ui/", dash)
	// 4.103 answers GET /balance with its editor to a browser: ours.
	mux.Handle("GET /balance", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dci.WantHTML(r) {
			dash.ServeHTTP(w, r)
			return
		}
		legacyAuth.ServeHTTP(w, r)
	}))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	return m.instrument(guard(o.LocalOnly, o.TrustedOrigins, log, mux), legacy, v1.(router), scheduler.(router), log)
}

// limitBody refuses bodies over n bytes: the handlers read at most n+1 and
// answer 413 (through the error http.MaxBytesReader returns). v1: in the v1
// error shape, else in 4.103's.
//
// A 4.103 route's body of unknown length (chunked) is read here, up to
// n+1 bytes, before its handler (which would read it whole anyway): its
// handlers answer a body they could not read with a 400, in 4.103's words.
func limitBody(n int64, v1 bool, next http.Handler) http.Handler {
	tooLarge := func(w http.ResponseWriter) {
		if v1 {
			apiv1.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", "the request body is larger than "+strconv.FormatInt(n, 10)+" bytes", "")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = w.Write([]byte(`{"error":"the request body is larger than ` + strconv.FormatInt(n, 10) + ` bytes"}`))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > n {
			tooLarge(w)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, n)
		if !v1 && r.ContentLength < 0 && r.Body != http.NoBody {
			b, err := io.ReadAll(r.Body)
			switch {
			case IsTooLarge(err):
				tooLarge(w)
				return
			case err != nil:
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(`{"error":"Could not read the request body"}`))
				return
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		}
		next.ServeHTTP(w, r)
	})
}

// IsTooLarge reports the error of reading a body over the limit.
func IsTooLarge(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight prometheus.Gauge
	control  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "disbatch_web_requests_total", Help: "HTTP requests answered, by route, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "disbatch_web_request_duration_seconds", Help: "Time to answer an HTTP request (to the end of its body; event streams excluded), by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "disbatch_web_requests_in_flight", Help: "HTTP requests being answered, event streams included.",
		}),
		control: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "disbatch_web_task_control_total",
			Help: "Tasks changed by kill, cancel and retry requests, by action: kill_requested (running or claimed: their node kills them), cancelled, settled (orphaned, finished as killed), requeued.",
		}, []string{"action"}),
	}
	for _, a := range apiv1.Actions {
		m.control.WithLabelValues(a) // exported as 0 from the start
	}
	reg.MustRegister(m.requests, m.duration, m.inflight, m.control)
	return m
}

// controlled counts the tasks a control request changed (apiv1.Options.Controlled).
func (m *metrics) controlled(action string, tasks int64) {
	if tasks > 0 {
		m.control.WithLabelValues(action).Add(float64(tasks))
	}
}

// legacyRouter names the route a request matches (dci's patterns).
type legacyRouter interface {
	Route(method, path string) string
}

// router names the route a request matches (apiv1's patterns). Asked
// rather than read from r.Pattern, which the handlers set on a copy of the
// request when authentication wraps them.
type router interface {
	Route(r *http.Request) string
}

func (m *metrics) instrument(next http.Handler, legacy legacyRouter, v1, scheduler router, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m.inflight.Inc()
		defer m.inflight.Dec()
		rec := &recorder{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(rec, r)
		var route string
		switch {
		case r.Pattern == refused:
			route = refused
		case strings.HasPrefix(r.URL.Path, "/api/v1/"):
			route = v1.Route(r)
		case r.Pattern == "GET /metrics":
			route = r.Pattern
		case r.Pattern == "GET /{$}" || r.Pattern == "GET /ui/":
			route = "dashboard"
		case slices.Contains(apiv1.SchedulerPaths, r.URL.Path):
			route = scheduler.Route(r)
		default:
			route = legacy.Route(r.Method, r.URL.Path)
		}
		method := r.Method
		switch method {
		case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		default:
			method = "other"
		}
		took := time.Since(start)
		m.requests.WithLabelValues(route, method, strconv.Itoa(rec.code)).Inc()
		if rec.Header().Get("Content-Type") != "text/event-stream" {
			m.duration.WithLabelValues(route, method).Observe(took.Seconds())
		}
		level := slog.LevelDebug
		if rec.code >= 500 {
			level = slog.LevelWarn
		}
		log.Log(r.Context(), level, "request", "method", r.Method, "path", r.URL.Path, "route", route, "code", rec.code,
			"duration_ms", float64(took.Microseconds())/1000, "remote", r.RemoteAddr)
	})
}

// recorder keeps the status code; Unwrap lets http.ResponseController
// reach the connection (flushes, deadlines) for event streams.
type recorder struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
