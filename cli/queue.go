package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func newQueueCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Create, list, change and delete queues",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newQueueCreate(g), newQueueList(g), newQueueShow(g), newQueueSet(g), newQueueDelete(g),
		newQueuePause(g, true), newQueuePause(g, false))
	return cmd
}

// newQueuePause is queue pause (paused) or queue resume.
func newQueuePause(g *globals, paused bool) *cobra.Command {
	use, short, long, done := "resume", "Resume a paused queue", `Resume a paused queue: every node hears it at once and claims its tasks.`, "resumed"
	if paused {
		use, short, done = "pause", "Pause a queue: no new task of it starts", "paused"
		long = `Pause a queue: no node claims its tasks until it is resumed; tasks already
claimed or running finish. The same as queue set NAME paused=true.`
	}
	return &cobra.Command{
		Use:     use + " NAME",
		Short:   short,
		Long:    long,
		Example: "  disbatch queue " + use + " demo",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("want one queue NAME (or id)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			s, q, release, err := g.openQueue(cmd, args[0])
			if err != nil {
				return err
			}
			defer release()
			if err := s.QueueUpdate(cmd.Context(), store.QueueUpdateParams{ID: q.ID, Paused: &paused}); err != nil {
				return err
			}
			fmt.Fprintf(g.io.Out, "%s queue %s\n", done, q.Name)
			return nil
		},
	}
}

// groupArgs is the Args of a command that only groups subcommands: any
// argument is a subcommand it does not have.
func groupArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

// parseMaxThreads accepts an integer from 0 to schema.MaxThreadsLimit, or
// "null".
func parseMaxThreads(s string) (*int, error) {
	if s == "null" {
		return nil, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > schema.MaxThreadsLimit {
		return nil, fmt.Errorf("maxthreads must be a non-negative integer (at most %d) or null, got %q", schema.MaxThreadsLimit, s)
	}
	return &n, nil
}

func newQueueCreate(g *globals) *cobra.Command {
	var constructor, maxThreads, sort string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create NAME --constructor PLUGIN",
		Short: "Create a queue",
		Long: `Create a queue whose tasks run with the plugin named by --constructor.

--maxthreads is how many of the queue's tasks each node runs at once. It
defaults to 1 so that a new queue runs; 0 or null runs nothing, as in Disbatch
(use it to create a paused queue). --sort picks which queued task is claimed
next: fifo (oldest first), lifo (newest first), priority (the highest task
priority first, then the oldest; see task submit --priority) or default
(MongoDB's order).

Both the seed-000 field names (constructor, maxthreads) and the Disbatch 4.103
ones (plugin, threads) are written, so Perl nodes run the queue too.`,
		Example: `  disbatch queue create demo --constructor Disbatch::Plugin::Demo --maxthreads 4 --sort fifo`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mt, err := parseMaxThreads(maxThreads)
			if err != nil {
				return &UsageError{Err: err}
			}
			p := store.QueueCreateParams{Name: args[0], Constructor: constructor, MaxThreads: mt, Sort: schema.Sort(sort)}
			if err := p.Validate(); err != nil {
				return &UsageError{Err: err}
			}
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			q, err := s.QueueCreate(cmd.Context(), p)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.io.Out, queueJSON(q, nil))
			}
			fmt.Fprintf(g.io.Out, "created queue %s (id %s, constructor %s, maxthreads %s, sort %s)\n", q.Name, q.ID.Hex(), q.Constructor, fmtMaxThreads(q.MaxThreads), q.Sort)
			return nil
		},
	}
	cmd.Flags().StringVar(&constructor, "constructor", "", "plugin that runs the queue's tasks (required), e.g. Disbatch::Plugin::Demo")
	cmd.Flags().StringVar(&maxThreads, "maxthreads", "1", "tasks of this queue each node runs at once: an integer >= 0, or null (0 and null run nothing)")
	cmd.Flags().StringVar(&sort, "sort", "default", "claim order: "+schema.SortNames)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the queue as JSON")
	return cmd
}

func fmtMaxThreads(m *int) string {
	if m == nil {
		return "null"
	}
	return strconv.Itoa(*m)
}

func newQueueList(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List queues with their task counts",
		Long: `List every queue: name, constructor, maxthreads, sort, tasks to do
(status <= 0), tasks running (claimed or running, -1 or 0, on any node), total
and tasks failed (status 2). Counts come from the queue's
count_todo/count_running/count_total/count_failed, kept by the nodes; a queue
missing any of them is recounted. Documents that cannot be read are reported on
stderr and skipped.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			res, err := s.QueueList(cmd.Context())
			if err != nil {
				return err
			}
			for _, m := range res.Malformed {
				fmt.Fprintln(g.io.Err, "warning: skipping", m)
			}
			var recount map[bson.ObjectID]store.QueueCounts
			for _, q := range res.Queues {
				if _, ok := storedCounts(q); !ok {
					if recount, err = s.QueueCountsGet(cmd.Context()); err != nil {
						return err
					}
					break
				}
			}
			counts := func(q schema.Queue) store.QueueCounts {
				if c, ok := storedCounts(q); ok {
					return c
				}
				return recount[q.ID]
			}
			if asJSON {
				out := make([]map[string]any, 0, len(res.Queues))
				for _, q := range res.Queues {
					c := counts(q)
					out = append(out, queueJSON(q, &c))
				}
				return writeJSON(g.io.Out, out)
			}
			var tw table
			tw.row("NAME", "CONSTRUCTOR", "MAXTHREADS", "SORT", "TODO", "RUNNING", "TOTAL", "FAILED", "ID")
			for _, q := range res.Queues {
				c := counts(q)
				sort := q.Sort
				if sort == "" {
					sort = schema.SortDefault
				}
				tw.row(q.Name, q.Constructor, fmtMaxThreads(q.MaxThreads), string(sort), fmt.Sprint(c.Todo), fmt.Sprint(c.Running), fmt.Sprint(c.Total), fmt.Sprint(c.Failed), q.ID.Hex())
				for _, w := range q.Warnings {
					fmt.Fprintf(g.io.Err, "warning: queue %s: %s\n", q.Name, w)
				}
			}
			return tw.print(g.io.Out)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// storedCounts are the queue's projected counters, when it has all four.
func storedCounts(q schema.Queue) (store.QueueCounts, bool) {
	if q.CountTodo == nil || q.CountTotal == nil || q.CountRunning == nil || q.CountFailed == nil {
		return store.QueueCounts{}, false
	}
	return store.QueueCounts{Todo: *q.CountTodo, Total: *q.CountTotal, Running: *q.CountRunning, Failed: *q.CountFailed}, true
}

func queueJSON(q schema.Queue, c *store.QueueCounts) map[string]any {
	m := map[string]any{
		"id":          q.ID.Hex(),
		"name":        q.Name,
		"constructor": q.Constructor,
		"maxthreads":  q.MaxThreads,
		"sort":        q.Sort,
	}
	if q.Sort == "" {
		m["sort"] = schema.SortDefault
	}
	if len(q.NodesPin) > 0 {
		m["nodes_pin"] = q.NodesPin
	}
	if len(q.NodesIgnore) > 0 {
		m["nodes_ignore"] = q.NodesIgnore
	}
	if c != nil {
		m["count_todo"], m["count_total"], m["count_running"], m["count_failed"] = c.Todo, c.Total, c.Running, c.Failed
	}
	ctl := q.Control
	m["timeout"] = ctl.Timeout.Seconds()
	m["retries"] = ctl.Retries
	m["retry_backoff"] = map[string]any{"base": ctl.Backoff.Base.Seconds(), "max": ctl.Backoff.Max.Seconds(), "jitter": ctl.Backoff.Jitter}
	m["rerun_orphans"] = ctl.RerunOrphans
	sc := q.Sched
	m["priority"], m["weight"], m["max_getwork"], m["paused"] = sc.Priority, sc.Weight, sc.MaxGetwork, sc.Paused
	m["max_running"], m["admitted"] = sc.MaxRunning, sc.Admitted
	m["continuous"], m["interval"] = sc.Continuous, sc.Interval.Seconds()
	if sc.Then != "" {
		m["then"] = sc.Then
	}
	if sc.Config != nil {
		if cj, err := bson.MarshalExtJSON(sc.Config, false, false); err == nil {
			m["config"] = json.RawMessage(cj)
		}
	}
	return m
}

func newQueueShow(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show one queue with its task control settings",
		Long: `Show one queue (NAME is a name or an id): its fields, its task counts, and how
its tasks are controlled: the time limit of each task once started, how many
times a failed attempt is retried and with what backoff, and whether the
running tasks of a node that died are rerun (rerun_orphans) or left orphaned
for an operator. Change them with "disbatch queue set".`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, q, done, err := g.openQueue(cmd, args[0])
			if err != nil {
				return err
			}
			defer done()
			c, ok := storedCounts(q)
			if !ok {
				all, err := s.QueueCountsGet(cmd.Context())
				if err != nil {
					return err
				}
				c = all[q.ID]
			}
			for _, w := range q.Warnings {
				fmt.Fprintf(g.io.Err, "warning: queue %s: %s\n", q.Name, w)
			}
			if asJSON {
				return writeJSON(g.io.Out, queueJSON(q, &c))
			}
			sort := q.Sort
			if sort == "" {
				sort = schema.SortDefault
			}
			w := g.io.Out
			fmt.Fprintf(w, "id:            %s\n", q.ID.Hex())
			fmt.Fprintf(w, "name:          %s\n", q.Name)
			fmt.Fprintf(w, "constructor:   %s\n", q.Constructor)
			fmt.Fprintf(w, "maxthreads:    %s\n", fmtMaxThreads(q.MaxThreads))
			fmt.Fprintf(w, "sort:          %s\n", sort)
			if len(q.NodesPin) > 0 {
				fmt.Fprintf(w, "nodes_pin:     %s\n", strings.Join(q.NodesPin, ", "))
			}
			if len(q.NodesIgnore) > 0 {
				fmt.Fprintf(w, "nodes_ignore:  %s\n", strings.Join(q.NodesIgnore, ", "))
			}
			fmt.Fprintf(w, "tasks:         %d to do (%d claimed or running), %d in all, %d failed\n", c.Todo, c.Running, c.Total, c.Failed)
			fmt.Fprintf(w, "scheduling:    %s\n", fmtSched(q.Sched))
			fmt.Fprintf(w, "timeout:       %s\n", fmtTimeout(q.Control.Timeout))
			fmt.Fprintf(w, "retries:       %s\n", fmtRetries(q.Control))
			fmt.Fprintf(w, "rerun_orphans: %t\n", q.Control.RerunOrphans)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the queue as JSON")
	return cmd
}

// fmtSched describes a queue's scheduling fields.
func fmtSched(sc schema.QueueSched) string {
	out := fmt.Sprintf("priority %s, weight %s", strconv.FormatFloat(sc.Priority, 'g', -1, 64), strconv.FormatFloat(sc.Weight, 'g', -1, 64))
	if sc.MaxGetwork > 0 {
		out += fmt.Sprintf(", at most %d per claim", sc.MaxGetwork)
	}
	if sc.Then != "" {
		out += ", output then to " + sc.Then
	}
	if sc.Continuous {
		out += fmt.Sprintf(", continuous every %s", sc.Interval)
	}
	if sc.Capped() {
		out += fmt.Sprintf(", at most %d running across all nodes (%d admitted)", sc.MaxRunning, sc.Admitted)
	}
	switch {
	case sc.Paused:
		out += ", paused"
	case sc.Weight < 0:
		out += ", not scheduled (negative weight)"
	}
	return out
}

func fmtTimeout(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}

func fmtRetries(c schema.QueueControl) string {
	if c.Retries == 0 {
		return "0 (a failed attempt is final)"
	}
	return fmt.Sprintf("%d, backoff %s doubling up to %s, jitter %g", c.Retries, c.Backoff.Base, c.Backoff.Max, c.Backoff.Jitter)
}

// parseBackoff reads --retry-backoff BASE,MAX,JITTER.
func parseBackoff(s string) (schema.Backoff, error) {
	parts := strings.Split(s, ",")
	bad := func(why string) (schema.Backoff, error) {
		return schema.Backoff{}, usagef("--retry-backoff %q: %s; want BASE,MAX,JITTER, e.g. 1s,5m,0.2", s, why)
	}
	if len(parts) != 3 {
		return bad(fmt.Sprintf("%d parts", len(parts)))
	}
	var b schema.Backoff
	var err error
	if b.Base, err = time.ParseDuration(strings.TrimSpace(parts[0])); err != nil {
		return bad("BASE is not a duration")
	}
	if b.Max, err = time.ParseDuration(strings.TrimSpace(parts[1])); err != nil {
		return bad("MAX is not a duration")
	}
	if b.Jitter, err = strconv.ParseFloat(strings.TrimSpace(parts[2]), 64); err != nil {
		return bad("JITTER is not a number")
	}
	if err := store.ValidateBackoff(b); err != nil {
		return schema.Backoff{}, &UsageError{Err: err}
	}
	return b, nil
}

const queueSetKeys = "name, constructor (or plugin), maxthreads (or threads: integer >= 0 or null), sort (fifo|lifo|priority|default), nodes_pin, nodes_ignore (comma-separated node names; empty to remove), " +
	"priority (a number), weight (a number; negative: never scheduled), nice (weight = 20 - nice), max_getwork (tasks per claim, 0: no limit), max_running (claimed and running tasks across all nodes, 0: no cap), config (a JSON object for the plugin; {} removes it), continuous (true|false), interval (seconds between a continuous queue's tasks), then (a queue a succeeded task's output becomes tasks of; empty removes it), paused (true|false)"

func newQueueSet(g *globals) *cobra.Command {
	var timeout time.Duration
	var retries int
	var backoff string
	var rerunOrphans bool
	cmd := &cobra.Command{
		Use:   "set NAME [KEY=VALUE...] [--timeout D] [--retries N] [--retry-backoff B,M,J] [--rerun-orphans=BOOL]",
		Short: "Change fields of a queue",
		Long: `Change fields of a queue. Keys: ` + queueSetKeys + `.

Scheduling across queues (docs/scheduling.md; Disbatch 4 nodes ignore these):
among the queues a node could claim from, only the highest priority is
tried; among equal priorities, the one with the fewest running tasks for its
weight goes first (default weight 20). A paused queue runs nothing new; its
running tasks finish; resuming it wakes the nodes at once. max_running caps
the queue's claimed and running tasks across all nodes, exactly (each claim
takes an admission in a transaction); it is written as threads too, the
name Disbatch 4.103 nodes read as the same cap.

How the queue's tasks are controlled (Disbatch 4 nodes ignore these):
  --timeout DURATION       time limit of each task once started: its node kills
                           it then (process group and all) and it fails with
                           reason timeout; a task's own limit overrides it;
                           0 removes it
  --retries N              a failed attempt is retried up to N times (0 to
                           ` + strconv.Itoa(schema.MaxRetries) + `) before the task finishes failed
  --retry-backoff B,M,J    delay before retry n: B doubled per retry up to M,
                           spread by ±J (a fraction), e.g. 1s,5m,0.2 (the
                           default when unset)
  --rerun-orphans=BOOL     whether the running tasks of a node that died go
                           back to the queue (true) or stay orphaned for an
                           operator to retry or kill (false); a rerun spends
                           one of --retries (one rerun at least)

Every value is checked before anything is written. maxthreads and constructor
are written under both their seed-000 and their Disbatch 4.103 names.`,
		Example: `  disbatch queue set demo maxthreads=8 sort=lifo
  disbatch queue set demo nodes_pin=node1,node2
  disbatch queue set demo maxthreads=null
  disbatch queue set demo priority=10 weight=4 max_getwork=16
  disbatch queue set demo max_running=5
  disbatch queue set demo --timeout 10m --retries 3 --retry-backoff 5s,10m,0.2 --rerun-orphans`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 1 {
				return usagef("want NAME and at least one KEY=VALUE")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var p store.QueueUpdateParams
			seen := map[string]bool{}
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usagef("%q is not KEY=VALUE", kv)
				}
				canon := map[string]string{"plugin": "constructor", "threads": "maxthreads", "nice": "weight"}[k]
				if canon == "" {
					canon = k
				}
				if seen[canon] {
					return usagef("%s given twice", canon)
				}
				seen[canon] = true
				switch canon {
				case "name":
					if err := store.ValidateQueueName(v); err != nil {
						return &UsageError{Err: err}
					}
					p.Name = &v
				case "constructor":
					if strings.TrimSpace(v) == "" {
						return usagef("constructor must not be empty")
					}
					p.Constructor = &v
				case "maxthreads":
					mt, err := parseMaxThreads(v)
					if err != nil {
						return &UsageError{Err: err}
					}
					p.SetMaxThreads, p.MaxThreads = true, mt
				case "sort":
					s := schema.Sort(v)
					if !s.Valid() || v == "" {
						return usagef("sort must be %s, got %q", schema.SortNames, v)
					}
					p.Sort = &s
				case "nodes_pin", "nodes_ignore":
					list := splitList(v)
					if canon == "nodes_pin" {
						p.NodesPin = &list
					} else {
						p.NodesIgnore = &list
					}
				case "priority", "weight":
					f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
					if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
						return usagef("%s must be a number, got %q", k, v)
					}
					if k == "nice" {
						f = schema.DefaultWeight - f
					}
					if canon == "priority" {
						p.Priority = &f
					} else {
						p.Weight = &f
					}
				case "max_getwork":
					n, err := strconv.Atoi(strings.TrimSpace(v))
					if err != nil || n < 0 || n > schema.MaxGetworkLimit {
						return usagef("max_getwork must be an integer from 0 (no limit) to %d, got %q", schema.MaxGetworkLimit, v)
					}
					p.MaxGetwork = &n
				case "then":
					name := strings.TrimSpace(v)
					p.Then = &name
				case "continuous":
					b, err := strconv.ParseBool(v)
					if err != nil {
						return usagef("continuous must be true or false, got %q", v)
					}
					p.Continuous = &b
				case "interval":
					f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
					if err != nil || math.IsNaN(f) || f < 0 || f > schema.MaxSeconds {
						return usagef("interval must be a number of seconds from 0 to %d, got %q", schema.MaxSeconds, v)
					}
					d := time.Duration(f * float64(time.Second))
					p.Interval = &d
				case "config":
					var doc bson.Raw
					if err := bson.UnmarshalExtJSON([]byte(v), false, &doc); err != nil {
						return usagef("config must be a JSON object, got %q: %v", v, err)
					}
					p.Config = doc
				case "max_running":
					n, err := strconv.Atoi(strings.TrimSpace(v))
					if err != nil || n < 0 || n > schema.MaxRunningLimit {
						return usagef("max_running must be an integer from 0 (no cap) to %d, got %q", schema.MaxRunningLimit, v)
					}
					p.MaxRunning = &n
				case "paused":
					b, err := strconv.ParseBool(v)
					if err != nil {
						return usagef("paused must be true or false, got %q", v)
					}
					p.Paused = &b
				default:
					return usagef("unknown key %q: keys are %s", k, queueSetKeys)
				}
			}
			flags := cmd.Flags()
			if flags.Changed("timeout") {
				if timeout < 0 || timeout > schema.MaxSeconds*time.Second {
					return usagef("--timeout must be from 0 (none) to %s, got %s", schema.MaxSeconds*time.Second, timeout)
				}
				p.Timeout = &timeout
			}
			if flags.Changed("retries") {
				if retries < 0 || retries > schema.MaxRetries {
					return usagef("--retries must be from 0 to %d, got %d", schema.MaxRetries, retries)
				}
				p.Retries = &retries
			}
			if flags.Changed("retry-backoff") {
				b, err := parseBackoff(backoff)
				if err != nil {
					return err
				}
				p.RetryBackoff = &b
			}
			if flags.Changed("rerun-orphans") {
				p.RerunOrphans = &rerunOrphans
			}
			if len(args) == 1 && p.Timeout == nil && p.Retries == nil && p.RetryBackoff == nil && p.RerunOrphans == nil {
				return usagef("want NAME and at least one KEY=VALUE or control flag (--timeout, --retries, --retry-backoff, --rerun-orphans)")
			}
			s, q, done, err := g.openQueue(cmd, args[0])
			if err != nil {
				return err
			}
			defer done()
			p.ID = q.ID
			if err := s.QueueUpdate(cmd.Context(), p); err != nil {
				return err
			}
			fmt.Fprintf(g.io.Out, "updated queue %s\n", q.Name)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "time limit of each task once started, e.g. 10m (0 removes it)")
	cmd.Flags().IntVar(&retries, "retries", 0, "retries of a failed attempt, 0 to "+strconv.Itoa(schema.MaxRetries))
	cmd.Flags().StringVar(&backoff, "retry-backoff", "", "BASE,MAX,JITTER: delay before a retry, doubling from BASE up to MAX, spread by ±JITTER (e.g. 1s,5m,0.2)")
	cmd.Flags().BoolVar(&rerunOrphans, "rerun-orphans", false, "rerun the running tasks of a node that died (true) or leave them orphaned (false)")
	return cmd
}

func splitList(v string) []string {
	out := []string{}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func newQueueDelete(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a queue and its tasks",
		Long: `Delete a queue together with its tasks and their GridFS output.

It refuses while the queue has unfinished tasks (status <= 0: queued, claimed,
running, or held back); --force deletes them too. Running tasks then finish
on their nodes, but their results have nowhere to go.`,
		Args: exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, q, done, err := g.openQueue(cmd, args[0])
			if err != nil {
				return err
			}
			defer done()
			res, err := s.QueueDelete(cmd.Context(), store.QueueDeleteParams{ID: q.ID, Force: force})
			if errors.Is(err, store.ErrUnfinishedTasks) {
				return fmt.Errorf("%w; wait for them, or use --force to delete them too", err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(g.io.Out, "deleted queue %s with %d tasks and %d output files\n", q.Name, res.TasksDeleted, res.FilesDeleted)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even while tasks are unfinished")
	return cmd
}
