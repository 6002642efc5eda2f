package node

import (
	"bytes"
	"io"
	"log/slog"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTaskLoggerWritesWhatWithWould: a task's logger writes the records
// base.With("queue", …, "task_id", …) writes, attributes in the same
// order, through With and WithGroup too, and nothing below the level.
func TestTaskLoggerWritesWhatWithWould(t *testing.T) {
	t.Parallel()
	render := func(make func(base *slog.Logger) *slog.Logger) string {
		var buf bytes.Buffer
		base := slog.New(slog.NewTextHandler(&buf, nil)).With("node", "n1")
		log := make(base)
		log.Debug("not written", "k", 1)
		log.Info("claimed", "status", 1, "why", "a b")
		log.With("attempt", 2).Warn("retrying", "error", "boom")
		log.WithGroup("g").Error("failed", "k", "v")
		log.Info("no attributes")
		return regexp.MustCompile(`time=\S+ `).ReplaceAllString(buf.String(), "")
	}
	want := render(func(base *slog.Logger) *slog.Logger { return base.With("queue", "q1", "task_id", "abc") })
	got := render(func(base *slog.Logger) *slog.Logger { return taskLogger(base, "q1", "abc") })
	require.Equal(t, want, got)
	require.Contains(t, got, `level=INFO msg=claimed node=n1 queue=q1 task_id=abc status=1 why="a b"`)
	require.NotContains(t, got, "not written")
}

// BenchmarkTaskLogger is a task's logger when nothing is written at its
// level (a task that runs well), against With.
func BenchmarkTaskLogger(b *testing.B) {
	base := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", "n1")
	b.Run("With", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			base.With("queue", "q1", "task_id", "0123456789abcdef01234567").Debug("task handed to its task_runner")
		}
	})
	b.Run("taskLogger", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			taskLogger(base, "q1", "0123456789abcdef01234567").Debug("task handed to its task_runner")
		}
	})
}
