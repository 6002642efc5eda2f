package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

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
	cmd.AddCommand(newQueueCreate(g), newQueueList(g), newQueueSet(g), newQueueDelete(g))
	return cmd
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
next: fifo (oldest first), lifo (newest first) or default (MongoDB's order).

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
	cmd.Flags().StringVar(&sort, "sort", "default", "claim order: fifo, lifo or default")
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
(status <= 0) and total. Counts come from the queue's count_todo/count_total,
kept by the nodes; a queue without them is recounted. Documents that cannot be
read are reported on stderr and skipped.`,
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
				if q.CountTodo == nil || q.CountTotal == nil {
					if recount, err = s.QueueCountsGet(cmd.Context()); err != nil {
						return err
					}
					break
				}
			}
			counts := func(q schema.Queue) (int64, int64) {
				if q.CountTodo != nil && q.CountTotal != nil {
					return *q.CountTodo, *q.CountTotal
				}
				c := recount[q.ID]
				return c.Todo, c.Total
			}
			if asJSON {
				out := make([]map[string]any, 0, len(res.Queues))
				for _, q := range res.Queues {
					todo, total := counts(q)
					out = append(out, queueJSON(q, &store.QueueCounts{Todo: todo, Total: total}))
				}
				return writeJSON(g.io.Out, out)
			}
			tw := tabwriter.NewWriter(g.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCONSTRUCTOR\tMAXTHREADS\tSORT\tTODO\tTOTAL\tID")
			for _, q := range res.Queues {
				todo, total := counts(q)
				sort := q.Sort
				if sort == "" {
					sort = schema.SortDefault
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", q.Name, q.Constructor, fmtMaxThreads(q.MaxThreads), sort, todo, total, q.ID.Hex())
				for _, w := range q.Warnings {
					fmt.Fprintf(g.io.Err, "warning: queue %s: %s\n", q.Name, w)
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
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
		m["count_todo"], m["count_total"] = c.Todo, c.Total
	}
	return m
}

const queueSetKeys = "name, constructor (or plugin), maxthreads (or threads: integer >= 0 or null), sort (fifo|lifo|default), nodes_pin, nodes_ignore (comma-separated node names; empty to remove)"

func newQueueSet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "set NAME KEY=VALUE...",
		Short: "Change fields of a queue",
		Long: `Change fields of a queue. Keys: ` + queueSetKeys + `.

Every value is checked before anything is written. maxthreads and constructor
are written under both their seed-000 and their Disbatch 4.103 names.`,
		Example: `  disbatch queue set demo maxthreads=8 sort=lifo
  disbatch queue set demo nodes_pin=node1,node2
  disbatch queue set demo maxthreads=null`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 2 {
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
				canon := map[string]string{"plugin": "constructor", "threads": "maxthreads"}[k]
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
						return usagef("sort must be fifo, lifo or default, got %q", v)
					}
					p.Sort = &s
				case "nodes_pin", "nodes_ignore":
					list := splitList(v)
					if canon == "nodes_pin" {
						p.NodesPin = &list
					} else {
						p.NodesIgnore = &list
					}
				default:
					return usagef("unknown key %q: keys are %s", k, queueSetKeys)
				}
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
