// Command disbatch-dev is the `make run` environment: a local MongoDB
// replica set with its data in a directory of the checkout, one node with
// the demo plugin, and a demo queue with a few tasks, kept running until
// Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/cli"
	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/internal/mongod"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func main() {
	port := flag.Int("port", 27017, "port of the local replica set")
	dir := flag.String("dir", ".disbatch-dev", "directory for the replica set's data (kept between runs)")
	nodeName := flag.String("node", "dev-node", "name of the demo node")
	webAddr := flag.String("web", "127.0.0.1:8080", "address of the web server (the Disbatch HTTP API); empty: none")
	flag.Parse()
	if err := run(*port, *dir, *nodeName, *webAddr); err != nil {
		fmt.Fprintln(os.Stderr, "disbatch-dev:", err)
		os.Exit(1)
	}
}

func run(port int, dir, nodeName, webAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	fmt.Printf("Starting a MongoDB %s replica set on 127.0.0.1:%d (data in %s)...\n", mongod.Version, port, dir)
	rs, err := mongod.StartReplicaSet(ctx, mongod.Options{Dir: dir, Ports: []int{port}})
	if err != nil {
		return fmt.Errorf("%w\n(run `make mongod` first if mongod is missing; PORT=N make run picks another port)", err)
	}
	defer func() {
		fmt.Println("Stopping the replica set...")
		if err := rs.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "disbatch-dev: stop replica set:", err)
		}
	}()
	uri := rs.URI()
	fmt.Printf("\nReplica set rs0 is up. Connect with:\n  export %s='%s'\n  go run ./cmd/disbatch queue list\n  (log: %s)\n\n",
		cmdline.EnvMongoURI, uri, filepath.Join(rs.Dir(), "m0", "mongod.log"))

	conn, err := cmdline.Connect(ctx, store.ConnectParams{URI: uri, Database: cmdline.DefaultDatabase})
	if err != nil {
		return err
	}
	defer conn.Close()
	st := conn.Store
	reg := plugin.NewRegistry()
	demo := plugin.Demo()
	demo.SetReports(st) // its reports, as 4.103's Demo writes them
	reg.Register(plugin.DemoConstructor, demo)
	n, err := node.New(node.Config{Name: nodeName, Store: st, Plugins: reg, Logger: log, Grace: 10 * time.Second})
	if err != nil {
		return err
	}
	if err := n.Start(ctx); err != nil {
		return err
	}
	defer n.Stop()

	webURL, stopWeb, err := startWeb(ctx, st, webAddr, log)
	if err != nil {
		return err
	}
	defer stopWeb()

	q, err := demoQueue(ctx, st)
	if err != nil {
		return err
	}
	ids, err := st.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: demoTasks()})
	if err != nil {
		return err
	}
	fmt.Printf("Submitted %d demo tasks to queue %q; node %s runs them:\n\n", len(ids), q.Name, nodeName)
	if err := waitFinished(ctx, st, ids); err != nil {
		return err
	}
	cli.Run(ctx, []string{"task", "list", q.Name, "--limit", "0", "--mongo-uri", uri}, cli.IO{In: strings.NewReader(""), Out: os.Stdout, Err: os.Stderr, Getenv: func(string) string { return "" }})
	if webURL != "" {
		fmt.Printf(`
The web server serves the Disbatch HTTP API at %s
  curl %squeues                      (the Disbatch 4.103 routes)
  curl %sapi/v1/queues               (the v1 API; %sapi/v1/openapi.json)
  curl -N %sapi/v1/events            (live task events)
`, webURL, webURL, webURL, webURL, webURL)
	}
	fmt.Printf(`
The node keeps running. In another terminal:
  export %s='%s'
  echo '{"commands":"ab"}' | go run ./cmd/disbatch task submit demo
  go run ./cmd/disbatch task list demo
  go run ./cmd/disbatch task show TASK_ID
  go run ./cmd/disbatch node list
Press Ctrl-C to stop the node and the replica set.
`, cmdline.EnvMongoURI, uri)
	<-ctx.Done()
	fmt.Println("\nStopping the node...")
	return nil
}

func demoQueue(ctx context.Context, st *store.Store) (schema.Queue, error) {
	q, err := st.QueueGet(ctx, store.QueueGetParams{Ref: "demo"})
	if err == nil {
		return q, nil
	}
	two := 2
	return st.QueueCreate(ctx, store.QueueCreateParams{Name: "demo", Constructor: plugin.DemoConstructor, MaxThreads: &two, Sort: schema.SortFIFO})
}

// demoTasks exercise the demo plugin: apple to stdout, banana to stderr,
// and "c" fails the task.
func demoTasks() []bson.Raw {
	var out []bson.Raw
	for _, c := range []string{"a", "ab", "abc", "*", "a"} {
		raw, _ := bson.Marshal(bson.D{{Key: "commands", Value: c}})
		out = append(out, raw)
	}
	return out
}

func waitFinished(ctx context.Context, st *store.Store, ids []bson.ObjectID) error {
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			t, err := st.TaskGet(ctx, id)
			if err != nil {
				return err
			}
			if t.Status.Finished() {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("demo task %s did not finish within 30 s (status %s)", id.Hex(), t.Status)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}
