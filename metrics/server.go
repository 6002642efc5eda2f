package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/disbatch-go/disbatch/internal/httpserver"
)

// DefaultHost is where a bare port binds: the metrics are not exposed
// beyond this machine unless a host (such as 0.0.0.0) is given.
const DefaultHost = httpserver.DefaultHost

// ListenAddr applies the address rule: "" is "" (metrics off); a bare port,
// "9464" or ":9464", binds DefaultHost only; HOST:PORT is used as given
// (0.0.0.0:9464 or [::]:9464 to listen on every interface).
func ListenAddr(addr string) (string, error) { return httpserver.ListenAddr("metrics address", addr) }

// Handler returns the HTTP handler of m's registry: /metrics, and an index
// at /. The server adds /healthz and /readyz.
func Handler(m *Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "disbatchd: /metrics /healthz /readyz")
	})
	return mux
}

// Server serves /metrics, /healthz (200 while the process answers) and
// /readyz (200 when m is ready, 503 otherwise) until Stop.
type Server struct{ hs *httpserver.Server }

// Serve listens on addr (see ListenAddr) and serves m until Stop, logging
// the URL of /metrics. An empty addr serves nothing: it returns a nil
// *Server, whose Stop does nothing.
func Serve(addr string, m *Metrics, log *slog.Logger) (*Server, error) {
	addr, err := ListenAddr(addr)
	if err != nil || addr == "" {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{hs: httpserver.New(httpserver.Config{
		Name: "metrics", Addr: addr, Handler: Handler(m), Ready: m.Ready,
		NotReady: "not ready: the node has not started (or is stopping)", Logger: log,
	})}
	if err := s.hs.Start(context.Background()); err != nil {
		return nil, err
	}
	log.Info("serving metrics", "url", s.URL(), "healthz", "/healthz", "readyz", "/readyz")
	return s, nil
}

// Addr is the address listened on (with the port chosen when it was 0).
func (s *Server) Addr() string { return s.hs.Addr() }

// URL is the URL of /metrics.
func (s *Server) URL() string { return "http://" + s.Addr() + "/metrics" }

// Stop shuts the server down: it stops listening, lets requests in flight
// finish (for at most 5 s, then closes their connections) and returns when
// the server has stopped, with what went wrong serving. It may be called
// more than once.
func (s *Server) Stop() error {
	if s == nil {
		return nil
	}
	s.hs.Stop()
	return s.hs.Err()
}
