package node

import (
	"context"
	"log/slog"
)

// taskLogger is base.With("queue", queue, "task_id", id), paid for only
// when a record is written: With formats its attributes at once (a text
// handler renders them into a buffer), for every task, and a task that
// runs well writes no record at its level. The records are the same,
// attributes in the same order (TestTaskLoggerWritesWhatWithWould).
func taskLogger(base *slog.Logger, queue, id string) *slog.Logger {
	return slog.New(&taskHandler{Handler: base.Handler(), attrs: [2]slog.Attr{slog.String("queue", queue), slog.String("task_id", id)}})
}

// taskHandler is taskLogger's handler: its attributes go first in each
// record, as With's would.
type taskHandler struct {
	slog.Handler
	attrs [2]slog.Attr
}

func (h *taskHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	rec.AddAttrs(h.attrs[:]...)
	r.Attrs(func(a slog.Attr) bool {
		rec.AddAttrs(a)
		return true
	})
	return h.Handler.Handle(ctx, rec)
}

// WithAttrs and WithGroup apply the task's attributes first (outside any
// group), as With then WithAttrs or WithGroup would.
func (h *taskHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.Handler.WithAttrs(append(h.attrs[:], as...))
}

func (h *taskHandler) WithGroup(name string) slog.Handler {
	return h.Handler.WithAttrs(h.attrs[:]).WithGroup(name)
}
