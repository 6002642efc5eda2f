// Package cli is the operator command line, `disbatch`: queues and tasks in
// a Disbatch database. cmd/disbatch only calls Main.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// Defaults shared by disbatch and disbatchd.
const (
	DefaultMongoURI = cmdline.DefaultMongoURI
	DefaultDatabase = cmdline.DefaultDatabase
	EnvMongoURI     = cmdline.EnvMongoURI
	EnvDatabase     = cmdline.EnvDatabase
)

// Exit codes.
const (
	ExitOK      = cmdline.ExitOK
	ExitRuntime = cmdline.ExitRuntime
	ExitUsage   = cmdline.ExitUsage
	// ExitTimeout: `task wait` gave up at its --timeout before every task
	// ended.
	ExitTimeout = 3
)

// exitError is an error that ends the command with its own exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// UsageError is a mistake in how the command was called (exit code 2).
type UsageError = cmdline.UsageError

var usagef = cmdline.Usagef

// IO are the streams a command uses; tests replace them.
type IO struct {
	In       io.Reader
	Out      io.Writer
	Err      io.Writer
	Terminal bool // whether Out is a terminal (submit's progress bar)
	// ErrTerminal is whether Err is a terminal (retry's progress bar).
	ErrTerminal bool
	Getenv      func(string) string
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
	code := Run(ctx, args, IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Terminal: isTerminal(os.Stdout), ErrTerminal: isTerminal(os.Stderr), Getenv: os.Getenv})
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
	code := cmdline.ExitCode(err)
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if code == ExitUsage {
		fmt.Fprintln(io.Err, "Run 'disbatch --help' for usage.")
	}
	return code
}

// globals are the flags every command shares.
type globals struct {
	io       IO
	mongoURI string
	database string
	by       string
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
	cmdline.AddConnectionFlags(root, &g.mongoURI, &g.database, io.Getenv)
	root.PersistentFlags().StringVar(&g.by, "by", "", "who asks, recorded with kills, cancels and retries (default $USER@hostname)")
	root.AddCommand(newQueueCmd(g), newTaskCmd(g), newNodeCmd(g), newUsersCmd(g))
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

// who is the --by of a request: the flag, or $USER@hostname.
func (g *globals) who() string {
	if by := strings.TrimSpace(g.by); by != "" {
		return by
	}
	name := g.io.Getenv("USER")
	if name == "" {
		name = g.io.Getenv("LOGNAME")
	}
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if name == "" {
		name = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// open connects for a command.
func (g *globals) open(cmd *cobra.Command) (*store.Store, func(), error) {
	conn, err := cmdline.Connect(cmd.Context(), store.ConnectParams{URI: g.mongoURI, Database: g.database})
	if err != nil {
		return nil, nil, err
	}
	return conn.Store, conn.Close, nil
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

// exactArgs: cmdline.ExactArgs.
var exactArgs = cmdline.ExactArgs
