package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/internal/httpserver"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web"
	"github.com/disbatch-go/disbatch/web/apiv1"
	"github.com/disbatch-go/disbatch/web/auth"
)

// Environment variables of settings without a flag given.
const (
	EnvListen = "DISBATCH_WEB_LISTEN"
	EnvUsers  = "DISBATCH_WEB_USERS"
	EnvJaeger = "DISBATCH_JAEGER_URL"
)

// DefaultListen is 4.103's address.
const DefaultListen = "127.0.0.1:8080"

type env struct {
	getenv  func(string) string
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	signals <-chan os.Signal
}

type settings struct {
	mongoURI, database string
	listen             string
	plugins            []string
	usersFile          string
	insecure           bool
	trustedOrigins     []string
	tlsCert, tlsKey    string
	legacyTasks        bool
	noMonitoring       bool
	balanceEnabled     bool
	webRoot            string
	jaegerURL          string
	perlConfig         string
	balance            map[string]any // 4.103's balance settings (--perl-config), else from --balance-enabled
	maxBody            int64
	logFormat          string
	logLevel           string
}

const longHelp = `disbatch-web serves the Disbatch HTTP API over the database the nodes use:

  /               the live dashboard for browsers (queues, tasks, nodes, submit,
                  balance; /ui/...), with 4.103's own page at /index.html
  /queues, ...    the Disbatch 4.103 command interface: GET /queues, POST /queues,
                  POST /tasks, GET /tasks, /nodes, /plugins, /balance, /monitoring...
                  answered as 4.103 answers them, so its bin/disbatch CLI, its web
                  page and sites' scripts work unchanged (point them at --listen)
  /api/v1/        the v1 JSON API (queues, tasks, output, nodes); its OpenAPI 3.1
                  document is /api/v1/openapi.json
  /api/v1/events  live task, queue and node events (Server-Sent Events, resumable
                  with Last-Event-ID)
  /metrics        Prometheus metrics of the requests; /healthz and /readyz

Security: on a loopback address (the default, 127.0.0.1:8080) no authentication
is required. On any other address disbatch-web refuses to start unless --users
names a credentials file, or --insecure says that the network is trusted.
Credentials: HTTP Basic (realm "disbatch", what 4.103's CLI sends with
--username/--password) and bearer tokens, each with a role: read (GET), write
(queues and tasks) or admin (nodes, balance). Make lines for the file with
'disbatch-web passwd NAME ROLE' and 'disbatch-web token NAME ROLE'.
--tls-cert and --tls-key serve HTTPS.

Settings come from flags, then the environment (DISBATCH_MONGO_URI,
DISBATCH_DATABASE, DISBATCH_WEB_LISTEN, DISBATCH_WEB_USERS, DISBATCH_JAEGER_URL),
then the defaults.
SIGTERM or SIGINT stops accepting requests, ends event streams and lets
requests in flight finish for a few seconds.`

func run(ctx context.Context, args []string, e env) int {
	var s settings
	cmd := &cobra.Command{
		Use:   "disbatch-web",
		Short: "The Disbatch HTTP API: 4.103 routes, v1 JSON API, live events",
		Long:  longHelp,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return cmdline.Usagef("disbatch-web takes no arguments, got %q (subcommands: passwd, token)", args)
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.SetIn(e.stdin)
	cmd.SetOut(e.stdout)
	cmd.SetErr(e.stderr)
	cmd.SetArgs(args)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &cmdline.UsageError{Err: err} })
	cmdline.AddConnectionFlags(cmd, &s.mongoURI, &s.database, e.getenv)
	f := cmd.Flags()
	listen := DefaultListen
	if v := e.getenv(EnvListen); v != "" {
		listen = v
	}
	f.StringVar(&s.listen, "listen", listen, "HOST:PORT to serve on (env "+EnvListen+"; a bare port binds 127.0.0.1)")
	f.StringSliceVar(&s.plugins, "plugins", []string{plugin.DemoConstructor, plugin.ExecConstructor, plugin.ShellConstructor},
		"plugin names GET /plugins answers and queue creation accepts (comma-separated; default: the node's built-in plugins)")
	f.StringVar(&s.jaegerURL, "jaeger-url", e.getenv(EnvJaeger), "Jaeger UI address (http://HOST:16686): the dashboard links each task to its trace there (env "+EnvJaeger+")")
	f.StringVar(&s.usersFile, "users", e.getenv(EnvUsers), "credentials file: turns authentication on (env "+EnvUsers+"; see 'disbatch-web passwd --help')")
	f.StringSliceVar(&s.trustedOrigins, "trusted-origin", nil, "an origin (scheme://host[:port]) whose pages may write through a browser although it is not the Host this server sees: the address browsers use when a plain-HTTP proxy in front passes another Host (repeatable or comma-separated; without it such writes are refused as cross-site)")
	f.BoolVar(&s.insecure, "insecure", false, "serve without authentication on a non-loopback address, or on the loopback for any Host (behind a proxy that passes its own; without it a loopback server answers only Hosts that name the loopback, against DNS rebinding)")
	f.StringVar(&s.tlsCert, "tls-cert", "", "PEM certificate file: serve HTTPS (with --tls-key)")
	f.StringVar(&s.tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	f.BoolVar(&s.legacyTasks, "legacy-tasks-routes", false, "also serve 4.103's deprecated Disbatch::Web::Tasks routes (POST /tasks/search, /tasks/:queue, /tasks/:queue/:collection)")
	f.BoolVar(&s.noMonitoring, "no-monitoring", false, "GET /monitoring answers \"monitoring disabled\" (4.103's monitoring: 0)")
	f.BoolVar(&s.balanceEnabled, "balance-enabled", false, "GET /monitoring checks QueueBalance's status (4.103's balance.enabled)")
	f.StringVar(&s.webRoot, "web-root", "", "folder of static files served for other GET paths (4.103's htdocs, for its web page)")
	f.StringVar(&s.perlConfig, "perl-config", "", "Disbatch 4.103's config.json (e.g. /etc/disbatch/config.json): mongohost, database, auth.disbatch_web, attributes.ssl, plugins, web_root, monitoring, balance, web_extensions; flags and the environment win over it; unknown keys are reported")
	f.Int64Var(&s.maxBody, "max-body-bytes", web.DefaultMaxBodyBytes, "largest request body accepted")
	f.StringVar(&s.logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&s.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		log, err := cmdline.NewLogger(e.stderr, s.logFormat, s.logLevel)
		if err != nil {
			return &cmdline.UsageError{Err: err}
		}
		if s.perlConfig != "" {
			notes, err := applyPerlConfig(cmd, &s, e.getenv)
			if err != nil {
				return &cmdline.UsageError{Err: err}
			}
			for _, n := range notes {
				log.Warn("--perl-config: "+n, "file", s.perlConfig)
			}
		}
		cfg, err := check(s)
		if err != nil {
			return &cmdline.UsageError{Err: err}
		}
		return serve(ctx, s, cfg, log, e.signals)
	}
	cmd.AddCommand(passwdCommand(e), tokenCommand(e))
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return cmdline.ExitOK
	}
	fmt.Fprintln(e.stderr, "disbatch-web:", err)
	code := cmdline.ExitCode(err)
	if code == cmdline.ExitUsage {
		fmt.Fprintln(e.stderr, "Run 'disbatch-web --help' for usage.")
	}
	return code
}

// checked are the settings once validated.
type checked struct {
	addr  string
	users *auth.Users
}

// check validates the settings before anything connects.
func check(s settings) (checked, error) {
	addr, err := httpserver.ListenAddr("--listen", s.listen)
	if err != nil {
		return checked{}, err
	}
	if addr == "" {
		return checked{}, errors.New("--listen must not be empty")
	}
	if (s.tlsCert == "") != (s.tlsKey == "") {
		return checked{}, errors.New("--tls-cert and --tls-key go together")
	}
	if s.maxBody <= 0 {
		return checked{}, fmt.Errorf("--max-body-bytes must be positive, got %d", s.maxBody)
	}
	if s.jaegerURL != "" {
		if u, err := url.Parse(s.jaegerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return checked{}, fmt.Errorf("--jaeger-url wants an http:// or https:// address, got %q", s.jaegerURL)
		}
	}
	var c checked
	c.addr = addr
	if s.usersFile != "" {
		if c.users, err = auth.LoadFile(s.usersFile); err != nil {
			return checked{}, fmt.Errorf("--users: %w", err)
		}
	}
	if c.users == nil && !s.insecure && !web.Loopback(addr) {
		return checked{}, fmt.Errorf("--listen %s is reachable from other machines: give --users FILE (authentication) or --insecure (a trusted network)", addr)
	}
	for _, o := range s.trustedOrigins {
		if err := web.CheckOrigin(o); err != nil {
			return checked{}, fmt.Errorf("--trusted-origin: %w", err)
		}
	}
	for _, p := range s.plugins {
		if strings.TrimSpace(p) == "" {
			return checked{}, errors.New("--plugins has an empty name")
		}
	}
	if s.webRoot != "" {
		if st, err := os.Stat(s.webRoot); err != nil || !st.IsDir() {
			return checked{}, fmt.Errorf("--web-root %s is not a folder here", s.webRoot)
		}
	}
	return c, nil
}

func serve(ctx context.Context, s settings, c checked, log *slog.Logger, signals <-chan os.Signal) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case sig := <-signals:
			log.Info("signal: stopping", "signal", sig.String())
			cancel()
		case <-ctx.Done():
		}
	}()
	// Listen at once: /healthz answers while MongoDB is being reached,
	// /readyz and the API answer 503 until it is.
	var api atomic.Pointer[http.Handler]
	srv := httpserver.New(httpserver.Config{
		Name: "web", Addr: c.addr, TLSCertFile: s.tlsCert, TLSKeyFile: s.tlsKey,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if h := api.Load(); h != nil {
				(*h).ServeHTTP(w, r)
				return
			}
			w.Header().Set("Retry-After", "1")
			if strings.HasPrefix(r.URL.Path, "/api/v1/") {
				apiv1.WriteError(w, http.StatusServiceUnavailable, apiv1.CodeUnavailable, "not ready: connecting to MongoDB; try again", "")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":"not ready: connecting to MongoDB"}`)
		}),
		Ready:           func() bool { return api.Load() != nil },
		NotReady:        "not ready: connecting to MongoDB",
		ShutdownTimeout: 5 * time.Second, Logger: log,
	})
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer srv.Stop()
	scheme := "http"
	if s.tlsCert != "" {
		scheme = "https"
	} else if c.users != nil && !web.Loopback(c.addr) {
		// A TLS proxy on this host would use the loopback; one elsewhere
		// still sends the credentials here in clear.
		log.Warn("--users without TLS on an address other machines reach: passwords and tokens cross the network in clear; give --tls-cert and --tls-key, or listen on the loopback behind a TLS proxy on this host",
			"listen", c.addr)
	}
	log.Info("listening", "url", scheme+"://"+srv.Addr()+"/", "healthz", "/healthz", "readyz", "/readyz")

	conn, err := cmdline.Connect(ctx, store.ConnectParams{URI: s.mongoURI, Database: s.database, Retry: true, Logger: log})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer conn.Close()
	st := conn.Store
	// Queue names are unique by this index (concurrent creates of one name
	// must not both win); the tasks' indexes are the nodes' to make, and
	// they decide which filters GET /tasks accepts, as in 4.103.
	var uniq *store.UniquenessError
	if err := st.IndexesEnsure(ctx, schema.CollQueues); errors.As(err, &uniq) {
		log.Error("indexes left out: creating a queue may then repeat a name", "error", err)
	} else if err != nil {
		return fmt.Errorf("ensure the queues' indexes: %w", err)
	}
	events, reg, err := startEvents(ctx, st, log)
	if err != nil {
		return err
	}
	defer events.Stop()
	h := web.NewHandler(web.Options{
		Store: st, Database: s.database, Plugins: s.plugins, LegacyTasks: s.legacyTasks,
		Monitoring: !s.noMonitoring, Balance: balanceSettings(s),
		WebRoot: s.webRoot, JaegerURL: s.jaegerURL, Users: c.users, LocalOnly: c.users == nil && !s.insecure && web.Loopback(c.addr), TrustedOrigins: s.trustedOrigins, Events: events, MaxBodyBytes: s.maxBody, Registry: reg, Logger: log,
	})
	api.Store(&h)
	log.Info("serving the Disbatch HTTP API", "url", scheme+"://"+srv.Addr()+"/", "v1", "/api/v1/openapi.json",
		"auth", c.users != nil, "database", s.database)
	<-ctx.Done()
	events.Stop() // ends the event streams, so that shutdown need not wait for them
	srv.Stop()
	log.Info("stopped")
	return srv.Err()
}

// passwdCommand prints a credentials line for a user.
func passwdCommand(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "passwd NAME ROLE",
		Short: "Print a --users file line for user NAME with ROLE (read, write, admin); the password is read from stdin",
		Long: `Reads a password (from the terminal without echo, or the first line of stdin)
and prints a line for the --users file:

  user NAME ROLE pbkdf2-sha256$ITERATIONS$SALT$HASH

Roles: read (GET routes), write (queues and tasks), admin (nodes, balance).
4.103's CLI sends these as --username NAME --password PASSWORD.`,
		Args: cmdline.ExactArgs("NAME", "ROLE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := nameAndRole(args)
			if err != nil {
				return err
			}
			pw, err := readPassword(e)
			if err != nil {
				return err
			}
			hash, err := auth.HashPassword(pw)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, auth.Line(auth.KindUser, args[0], role, hash))
			return nil
		},
	}
}

// nameAndRole checks the NAME ROLE arguments of passwd and token.
func nameAndRole(args []string) (auth.Role, error) {
	role, err := auth.ParseRole(args[1])
	if err != nil {
		return 0, &cmdline.UsageError{Err: err}
	}
	if err := auth.CheckName(args[0]); err != nil {
		return 0, &cmdline.UsageError{Err: err}
	}
	return role, nil
}

func readPassword(e env) (string, error) {
	if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(e.stderr, "Password: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(e.stderr)
		if err != nil {
			return "", err
		}
		return string(b), nil
	}
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		return "", &cmdline.UsageError{Err: errors.New("empty password on stdin")}
	}
	return pw, nil
}

// tokenCommand makes a bearer token.
func tokenCommand(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "token NAME ROLE",
		Short: "Make a bearer token for NAME with ROLE: prints the token on stderr (give it to the client) and its --users file line on stdout",
		Long: `Makes a random bearer token. It prints the token on stderr: the client sends it
as 'Authorization: Bearer TOKEN' (or as the password of HTTP Basic with user
NAME). It prints the line to add to the --users file on stdout: that line holds
only a salted hash of the token, so

  disbatch-web token ci-bot read >> web-users

shows the token and appends its line (2>FILE keeps the token in FILE).`,
		Args: cmdline.ExactArgs("NAME", "ROLE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			role, err := nameAndRole(args)
			if err != nil {
				return err
			}
			tok, hash, err := auth.NewToken()
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stderr, tok)
			fmt.Fprintln(e.stdout, auth.Line(auth.KindToken, args[0], role, hash))
			return nil
		},
	}
}
