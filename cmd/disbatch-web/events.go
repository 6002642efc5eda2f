package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/apiv1"
	"github.com/disbatch-go/disbatch/web/live"
)

// startEvents starts the live event hub over st, and the registry of the
// server's metrics (the hub's among them).
func startEvents(ctx context.Context, st *store.Store, log *slog.Logger) (*live.Hub, *prometheus.Registry, error) {
	// Task events need the document before each change (from-status,
	// queue): our writes say it themselves, other programs' changes need
	// pre-images. The projector turns them on and off as other programs
	// write, and the hub asks for them only while they are on; until a
	// projector runs, they are on.
	if err := st.TasksPreImagesEnable(ctx); err != nil {
		log.Warn("cannot turn on change-stream pre-images for tasks: task events will lack their from-status and queue until a node's projector does",
			"error", err)
	}
	h := live.New(live.Options{Store: st, Lookup: st, Logger: log.With("component", "live"), OnError: writeLiveError})
	if err := h.Start(ctx); err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), live.NewCollector(h))
	return h, reg, nil
}

// writeLiveError answers the event stream's errors in the v1 shape.
func writeLiveError(w http.ResponseWriter, _ *http.Request, e *live.Error) {
	apiv1.WriteError(w, e.Status, e.Code, e.Message, e.Field)
}
