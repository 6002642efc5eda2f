package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultHost is where a bare port binds: the metrics are not exposed
// beyond this machine unless a host (such as 0.0.0.0) is given.
const DefaultHost = "127.0.0.1"

// ListenAddr applies the address rule: "" is "" (metrics off); a bare port,
// "9464" or ":9464", binds DefaultHost only; HOST:PORT is used as given
// (0.0.0.0:9464 or [::]:9464 to listen on every interface).
func ListenAddr(addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		return net.JoinHostPort(DefaultHost, addr), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metrics address %q: want HOST:PORT or PORT (e.g. 127.0.0.1:9464, 0.0.0.0:9464, 9464)", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("metrics address %q: the port must be a number from 0 to 65535", addr)
	}
	if host == "" {
		host = DefaultHost
	}
	return net.JoinHostPort(host, port), nil
}

// Server serves /metrics, /healthz and /readyz until Stop.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	log  *slog.Logger
	done chan struct{}
	err  error // Serve's error, once done is closed
	once sync.Once
}

// Handler returns the HTTP handler of m: /metrics (the registry), /healthz
// (200 while the process answers) and /readyz (200 when m is ready, 503
// otherwise).
func Handler(m *Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !m.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: the node has not started (or is stopping)")
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "disbatchd: /metrics /healthz /readyz")
	})
	return mux
}

// Serve listens on addr (see ListenAddr) and serves m's Handler until Stop,
// logging the URL of /metrics. An empty addr serves nothing: it returns a
// nil *Server, whose Stop does nothing.
func Serve(addr string, m *Metrics, log *slog.Logger) (*Server, error) {
	addr, err := ListenAddr(addr)
	if err != nil || addr == "" {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	s := &Server{
		srv: &http.Server{
			Handler:           Handler(m),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		ln: ln, log: log, done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
			log.Error("metrics server stopped", "error", err)
		}
	}()
	log.Info("serving metrics", "url", s.URL(), "healthz", "/healthz", "readyz", "/readyz")
	return s, nil
}

// Addr is the address listened on (with the port chosen when it was 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the URL of /metrics.
func (s *Server) URL() string { return "http://" + s.Addr() + "/metrics" }

// Stop shuts the server down: it stops listening, lets requests in flight
// finish (for at most 5 s, then closes their connections) and returns when
// the server's goroutine has ended. It may be called more than once.
func (s *Server) Stop() error {
	if s == nil {
		return nil
	}
	var err error
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err = s.srv.Shutdown(ctx); err != nil {
			err = errors.Join(err, s.srv.Close())
		}
		<-s.done
		err = errors.Join(err, s.err)
	})
	return err
}
