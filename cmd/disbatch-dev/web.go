package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/internal/httpserver"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web"
	"github.com/disbatch-go/disbatch/web/apiv1"
	"github.com/disbatch-go/disbatch/web/live"
)

// startWeb serves the HTTP API on addr (loopback, no authentication) and
// returns its URL and how to stop it; an empty addr serves nothing.
func startWeb(ctx context.Context, st *store.Store, addr string, log *slog.Logger) (string, func(), error) {
	if addr == "" {
		return "", func() {}, nil
	}
	addr, err := httpserver.ListenAddr("--web", addr)
	if err != nil {
		return "", nil, err
	}
	hub := live.New(live.Options{Store: st, Lookup: st, Logger: log.With("component", "live"),
		OnError: func(w http.ResponseWriter, _ *http.Request, e *live.Error) {
			apiv1.WriteError(w, e.Status, e.Code, e.Message, e.Field)
		}})
	if err := hub.Start(ctx); err != nil {
		return "", nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(live.NewCollector(hub))
	h := web.NewHandler(web.Options{
		Store: st, Database: cmdline.DefaultDatabase, Plugins: []string{plugin.DemoConstructor, plugin.ExecConstructor, plugin.ShellConstructor},
		Monitoring: true, Events: hub, Registry: reg, Logger: log.With("component", "web"), LocalOnly: web.Loopback(addr),
	})
	srv := httpserver.New(httpserver.Config{Name: "web", Addr: addr, Handler: h, Logger: log})
	if err := srv.Start(ctx); err != nil {
		hub.Stop()
		return "", nil, err
	}
	return "http://" + srv.Addr() + "/", func() { hub.Stop(); srv.Stop() }, nil
}
