// Package cli is the operator command line, `disbatch`: queues and tasks in
// a Disbatch database. cmd/disbatch only calls Main.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// Defaults shared by disbatch and disbatchd.
const (
	DefaultMongoURI = "mongodb://127.0.0.1:27017/?replicaSet=rs0"
	DefaultDatabase = "disbatch"
	EnvMongoURI     = "DISBATCH_MONGO_URI"
	EnvDatabase     = "DISBATCH_DATABASE"
	// connectTimeout bounds how long a command waits for MongoDB before it
	// says it cannot reach it (instead of the driver's 30 s).
	connectTimeout = 5 * time.Second
)

// Exit codes.
const (
	ExitOK      = 0
	ExitRuntime = 1
	ExitUsage   = 2
)

// UsageError is a mistake in how the command was called (exit code 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

func usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// IO are the streams a command uses; tests replace them.
type IO struct {
	In       io.Reader
	Out      io.Writer
	Err      io.Writer
	Terminal bool // whether Out is a terminal (progress bars)
	Getenv   func(string) string
}

// Main runs the CLI with the process's streams and returns the exit code.
// With tracing configured in the environment (see package tracing), `task
// submit` records a span and stores its trace context in the tasks.
func Main(args []string) int {
	ctx := context.Background()
	shutdown, err := tracing.Setup(ctx, "disbatch")
	if err != nil {
		fmt.Fprintln(os.Stderr, "disbatch: tracing is configured but cannot start:", err)
		return ExitRuntime
	}
	code := Run(ctx, args, IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Terminal: isTerminal(os.Stdout), Getenv: os.Getenv})
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "disbatch: flushing traces:", err)
	}
	return code
}

// Run runs the CLI with args (without the program name) and returns the exit
// code. Errors are printed on io.Err.
func Run(ctx context.Context, args []string, io IO) int {
	cmd := newRoot(io)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(io.Err, "disbatch:", err)
	var ue *UsageError
	if errors.As(err, &ue) {
		fmt.Fprintln(io.Err, "Run 'disbatch --help' for usage.")
		return ExitUsage
	}
	return ExitRuntime
}

// globals are the flags every command shares.
type globals struct {
	io       IO
	mongoURI string
	database string
}

func newRoot(io IO) *cobra.Command {
	if io.Getenv == nil {
		io.Getenv = os.Getenv
	}
	g := &globals{io: io}
	root := &cobra.Command{
		Use:   "disbatch",
		Short: "Operate a Disbatch 4 database: queues, tasks and nodes",
		Long: `disbatch manages the queues and tasks of a Disbatch 4 database in MongoDB.
Execution nodes (disbatchd, or Disbatch 4 Perl nodes sharing the database)
claim and run the tasks; "disbatch node" lists them and drains them.

MongoDB is reached with --mongo-uri (env ` + EnvMongoURI + `) and the database
named by --database (env ` + EnvDatabase + `).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(io.In)
	root.SetOut(io.Out)
	root.SetErr(io.Err)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &UsageError{Err: err} })
	AddConnectionFlags(root, &g.mongoURI, &g.database, io.Getenv)
	root.AddCommand(newQueueCmd(g), newTaskCmd(g), newNodeCmd(g))
	// Unknown subcommands are usage errors too.
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usagef("unknown command %q", args[0])
		}
		return cmd.Help()
	}
	root.Args = cobra.ArbitraryArgs
	return root
}

// AddConnectionFlags adds --mongo-uri and --database with their environment
// variables as defaults. disbatchd uses the same flags.
func AddConnectionFlags(cmd *cobra.Command, uri, db *string, getenv func(string) string) {
	defURI, defDB := DefaultMongoURI, DefaultDatabase
	if v := getenv(EnvMongoURI); v != "" {
		defURI = v
	}
	if v := getenv(EnvDatabase); v != "" {
		defDB = v
	}
	cmd.PersistentFlags().StringVar(uri, "mongo-uri", defURI, "MongoDB connection string; a replica set is needed for change streams (env "+EnvMongoURI+")")
	cmd.PersistentFlags().StringVar(db, "database", defDB, "database holding the Disbatch collections (env "+EnvDatabase+")")
	// Never show a password in --help.
	if f := cmd.PersistentFlags().Lookup("mongo-uri"); f != nil {
		f.DefValue = RedactURI(defURI)
	}
}

var userinfo = regexp.MustCompile(`^(mongodb(?:\+srv)?://)([^@/]*)@`)

// RedactURI hides the password of a MongoDB URI, for logs and errors.
func RedactURI(uri string) string {
	return userinfo.ReplaceAllStringFunc(uri, func(m string) string {
		parts := userinfo.FindStringSubmatch(m)
		user, _, hasPass := strings.Cut(parts[2], ":")
		if !hasPass {
			return m
		}
		return parts[1] + user + ":xxxxx@"
	})
}

// Connect opens a client, checks that MongoDB answers within a few seconds,
// and returns a Store over database db. The error says which URI failed and
// what to try, without the password.
func Connect(ctx context.Context, uri, db string) (*store.Store, func(), error) {
	cs, err := connstring.ParseAndValidate(uri)
	if err != nil {
		return nil, nil, &UsageError{Err: fmt.Errorf("--mongo-uri %q is not a valid MongoDB connection string: %v", RedactURI(uri), scrub(err, uri))}
	}
	opts := options.Client().ApplyURI(uri)
	if !cs.ServerSelectionTimeoutSet {
		opts.SetServerSelectionTimeout(connectTimeout)
	}
	if !cs.ConnectTimeoutSet {
		opts.SetConnectTimeout(connectTimeout)
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		return nil, nil, unreachable(uri, err)
	}
	closeFn := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(cctx)
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout+time.Second)
	defer cancel()
	if err := client.Ping(pctx, readpref.Primary()); err != nil {
		closeFn()
		return nil, nil, unreachable(uri, err)
	}
	return store.New(client.Database(db), store.Options{}), closeFn, nil
}

func unreachable(uri string, err error) error {
	cause := scrub(err, uri)
	// The driver's server-selection errors are long; keep the gist.
	if i := strings.Index(cause, ", current topology:"); i > 0 {
		cause = cause[:i]
	}
	return fmt.Errorf("cannot reach MongoDB at %s: %s\n"+
		"Is mongod running as a replica set there? Start a local one with `make run`, or point --mongo-uri (env %s) at yours.",
		RedactURI(uri), cause, EnvMongoURI)
}

// scrub removes the URI's password from an error text.
func scrub(err error, uri string) string {
	s := err.Error()
	if m := userinfo.FindStringSubmatch(uri); m != nil {
		if _, pass, ok := strings.Cut(m[2], ":"); ok && pass != "" {
			s = strings.ReplaceAll(s, pass, "xxxxx")
		}
	}
	return s
}

// open connects for a command.
func (g *globals) open(cmd *cobra.Command) (*store.Store, func(), error) {
	return Connect(cmd.Context(), g.mongoURI, g.database)
}

// openQueue connects and looks up the queue named by ref (a name or an id).
// On success the caller must call done.
func (g *globals) openQueue(cmd *cobra.Command, ref string) (*store.Store, schema.Queue, func(), error) {
	s, done, err := g.open(cmd)
	if err != nil {
		return nil, schema.Queue{}, nil, err
	}
	q, err := s.QueueGet(cmd.Context(), store.QueueGetParams{Ref: ref})
	if err != nil {
		done()
		return nil, schema.Queue{}, nil, err
	}
	return s, q, done, nil
}

// exactArgs is cobra.ExactArgs with a usage error and names for the args.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usagef("want %d argument(s) (%s), got %d", len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}
