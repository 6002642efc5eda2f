// Package cmdline is what the project's binaries share on their command
// line: the connection flags and their environment, usage errors and exit
// codes, connecting the way an operator expects (clear errors, no
// password), and the log setup.
package cmdline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/store"
)

// Defaults and environment variables shared by the binaries.
const (
	DefaultMongoURI = "mongodb://127.0.0.1:27017/?replicaSet=rs0"
	DefaultDatabase = "disbatch"
	EnvMongoURI     = "DISBATCH_MONGO_URI"
	EnvDatabase     = "DISBATCH_DATABASE"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitRuntime = 1
	ExitUsage   = 2
)

// UsageError is a mistake in how a command was called (exit code 2).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// ExactArgs is cobra.ExactArgs as a usage error (exit 2) that names the
// arguments it wants.
func ExactArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return Usagef("want %d argument(s) (%s), got %d", len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}

// ExitCode is the exit code for an error returned by a command: 0 for
// nil, 2 for a usage error, 1 otherwise.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	}
	return ExitRuntime
}

// AddConnectionFlags adds --mongo-uri and --database with their environment
// variables as defaults. The password of a URI is never shown in --help.
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
	if f := cmd.PersistentFlags().Lookup("mongo-uri"); f != nil {
		f.DefValue = store.RedactURI(defURI)
	}
}

// Connect is store.Connect with errors for an operator: a URI that cannot
// be parsed is a usage error naming --mongo-uri, an unreachable MongoDB
// says what to try.
func Connect(ctx context.Context, p store.ConnectParams) (*store.Conn, error) {
	if p.Database == "" {
		return nil, &UsageError{Err: fmt.Errorf("--database is empty (env %s)", EnvDatabase)}
	}
	conn, err := store.Connect(ctx, p)
	var ue *store.URIError
	var un *store.UnreachableError
	switch {
	case errors.As(err, &ue):
		return nil, &UsageError{Err: fmt.Errorf("--mongo-uri %w", ue)}
	case errors.As(err, &un):
		return nil, fmt.Errorf("%w\nIs mongod running as a replica set there? Start a local one with `make run`, or point --mongo-uri (env %s) at yours.", un, EnvMongoURI)
	}
	return conn, err
}

// NewLogger returns a log/slog logger writing text or JSON to w at level.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
