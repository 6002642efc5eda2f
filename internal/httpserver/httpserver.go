// Package httpserver runs the project's HTTP servers (the node's metrics
// endpoint, the web server): listen, serve with timeouts and limits, answer
// /healthz and /readyz, and shut down gracefully, with one lifecycle.
package httpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/internal/lifecycle"
)

// DefaultHost is where a bare port binds: nothing is exposed beyond this
// machine unless a host (such as 0.0.0.0) is given.
const DefaultHost = "127.0.0.1"

// ListenAddr applies the address rule to the address of what ("metrics
// address"): "" is "" (off); a bare port, "9464" or ":9464", binds
// DefaultHost only; HOST:PORT is used as given (0.0.0.0:9464 or [::]:9464
// to listen on every interface).
func ListenAddr(what, addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		return net.JoinHostPort(DefaultHost, addr), nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%s %q: want HOST:PORT or PORT (e.g. 127.0.0.1:9464, 0.0.0.0:9464, 9464)", what, addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("%s %q: the port must be a number from 0 to 65535", what, addr)
	}
	if host == "" {
		host = DefaultHost
	}
	return net.JoinHostPort(host, port), nil
}

// Defaults of Config.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultShutdownTimeout   = 5 * time.Second
)

// Config configures a Server.
type Config struct {
	// Name names the server in logs and errors ("metrics").
	Name string
	// Addr is HOST:PORT (see ListenAddr); port 0 picks a free one.
	Addr string
	// Handler serves everything but /healthz and /readyz.
	Handler http.Handler
	// Ready says what /readyz answers: 200 when it returns true, 503 with
	// NotReady otherwise. nil: always ready.
	Ready    func() bool
	NotReady string
	// Timeouts and limits; zero: the defaults above. WriteTimeout < 0
	// turns the write timeout off (long-lived streams).
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	// ShutdownTimeout is how long Stop lets requests in flight finish
	// before it closes their connections.
	ShutdownTimeout time.Duration
	// TLSCertFile and TLSKeyFile, both set, serve HTTPS (TLS 1.2 or
	// newer) with that certificate; they are read at Start.
	TLSCertFile string
	TLSKeyFile  string
	Logger      *slog.Logger
}

// Server is an HTTP server with the project's lifecycle: Start listens and
// serves, Stop shuts down gracefully.
type Server struct {
	lifecycle.Base
	cfg Config
	log *slog.Logger

	mu  sync.Mutex
	ln  net.Listener
	err error // of the last run: serving or shutting down
}

// New returns a server; nothing listens until Start.
func New(cfg Config) *Server {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	def(&cfg.ReadTimeout, DefaultReadTimeout)
	def(&cfg.WriteTimeout, DefaultWriteTimeout)
	def(&cfg.IdleTimeout, DefaultIdleTimeout)
	def(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	if cfg.WriteTimeout < 0 {
		cfg.WriteTimeout = 0
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.NotReady == "" {
		cfg.NotReady = "not ready"
	}
	return &Server{cfg: cfg, log: cfg.Logger}
}

// Start listens on the address (an error when it cannot) and serves until
// Stop.
func (s *Server) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(_ context.Context, run *lifecycle.Run) error {
		var tlsConfig *tls.Config
		if s.cfg.TLSCertFile != "" || s.cfg.TLSKeyFile != "" {
			cert, err := tls.LoadX509KeyPair(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
			if err != nil {
				return fmt.Errorf("%s: load the TLS certificate and key: %w", s.cfg.Name, err)
			}
			// h2 first: over HTTP/1.1 a browser keeps at most six
			// connections to a server, and each dashboard tab's event
			// stream holds one for good, so a seventh tab (and every
			// request of the six) would hang. srv.Serve answers h2 once
			// the listener offers it.
			tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
		}
		ln, err := net.Listen("tcp", s.cfg.Addr)
		if err != nil {
			return fmt.Errorf("%s: %w", s.cfg.Name, err)
		}
		if tlsConfig != nil {
			ln = tls.NewListener(ln, tlsConfig)
		}
		srv := &http.Server{
			Handler:           s.routes(),
			ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
			ReadTimeout:       s.cfg.ReadTimeout,
			WriteTimeout:      s.cfg.WriteTimeout,
			IdleTimeout:       s.cfg.IdleTimeout,
			MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}
		s.mu.Lock()
		s.ln, s.err = ln, nil
		s.mu.Unlock()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		run.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
			defer cancel()
			err := srv.Shutdown(ctx)
			if err != nil {
				err = errors.Join(err, srv.Close())
			}
			if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
				err = errors.Join(err, serr)
			}
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
		})
		return nil
	})
}

// routes puts /healthz and /readyz in front of the handler.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.cfg.Ready != nil && !s.cfg.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, s.cfg.NotReady)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if s.cfg.Handler != nil {
		mux.Handle("/", s.cfg.Handler)
	}
	return mux
}

// Addr is the address listened on (with the port chosen when it was 0).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return s.cfg.Addr
	}
	return s.ln.Addr().String()
}

// Err is what went wrong serving or shutting down in the last run that
// stopped, if anything.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
