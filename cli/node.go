package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "List execution nodes and drain them",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newNodeList(g), newNodeDrain(g))
	return cmd
}

func newNodeList(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List nodes: state, heartbeat age, running tasks, dead or draining",
		Long: `List every node document: its name, state (running, draining or stopped, as
the node last wrote it), the age of its last heartbeat by the server's clock,
the tasks it is running, its maxthreads cap, and whether another node declared
it dead (its heartbeat was older than that node's --dead-after: its claimed
tasks went back to the queue and its running ones were orphaned) or an
operator asked it to drain. Disbatch 4.103 Perl nodes are listed too; they
write no state. With --json, nodes of this version also show serves (the ids
of the queues they serve, or would but for what stops every node alike: a
pause, maxthreads 0), full (those whose slots they had all taken) and
wakeup_stream (false: --poll-only), which other nodes read to pick each
queue's wake-up listeners: nodes with a stream, the full ones last. The
table's notes say "polling only" for a node whose heartbeat reports no
stream, name the queues a node is full on (a dead node's, as of its last
heartbeat), and say "fenced" for a node that has not stopped but whose
heartbeat is older than its own --fence-after (which it writes, as
fence_after_ms): cut off from MongoDB, it has stopped its tasks.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			res, err := s.NodeList(cmd.Context())
			if err != nil {
				return err
			}
			for _, m := range res.Malformed {
				fmt.Fprintln(g.io.Err, "warning: skipping", m)
			}
			if asJSON {
				out := make([]map[string]any, 0, len(res.Nodes))
				for _, n := range res.Nodes {
					out = append(out, nodeJSON(n, res.Now))
				}
				return writeJSON(g.io.Out, out)
			}
			var tw table
			tw.row("NODE", "STATE", "HEARTBEAT", "RUNNING", "MAXTHREADS", "NOTES")
			for _, n := range res.Nodes {
				state := n.State
				if state == "" {
					state = "-"
				}
				tw.row(n.Node, state, heartbeatAge(n, res.Now), fmt.Sprint(running(n)), nodeMaxThreads(n), nodeNotes(n, res.Now))
			}
			return tw.print(g.io.Out)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func heartbeatAge(n schema.Node, now time.Time) string {
	if n.Timestamp.IsZero() || now.IsZero() {
		return "never"
	}
	age := now.Sub(n.Timestamp)
	if age < 0 {
		age = 0
	}
	return age.Round(100*time.Millisecond).String() + " ago"
}

func running(n schema.Node) int64 {
	var sum int64
	for _, q := range n.Queues {
		sum += q.TasksDoing
	}
	return sum
}

func nodeNotes(n schema.Node, now time.Time) string {
	var notes []string
	if n.Dead {
		notes = append(notes, "DEAD (declared by "+n.DeadBy+" at "+n.DeadAt.Format(time.RFC3339)+")")
	} else if n.Fenced(now) {
		notes = append(notes, "fenced: no heartbeat for its --fence-after ("+n.FenceAfter.String()+")")
	}
	if n.Drain {
		notes = append(notes, "drain requested")
	}
	if n.Serves != nil && !n.WakeupStream { // said, and no stream
		notes = append(notes, "polling only")
	}
	if len(n.Full) > 0 {
		notes = append(notes, "full: "+queueNames(n, n.Full))
	}
	return strings.Join(notes, "; ")
}

// queueNames names the queues ids among n's heartbeat queues (an id it does
// not list stays an id), comma-separated.
func queueNames(n schema.Node, ids []string) string {
	names := make(map[string]string, len(n.Queues))
	for _, q := range n.Queues {
		names[q.ID] = q.Name
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id
		if name, ok := names[id]; ok && name != "" {
			out[i] = name
		}
	}
	return strings.Join(out, ", ")
}

func nodeJSON(n schema.Node, now time.Time) map[string]any {
	m := map[string]any{
		"node":           n.Node,
		"state":          n.State,
		"timestamp":      n.Timestamp,
		"running":        running(n),
		"maxthreads":     n.MaxThreads,
		"own_maxthreads": n.OwnMaxThreads,
		"fence_after_ms": nil,
		"dead":           n.Dead,
		"drain":          n.Drain,
	}
	if !n.Timestamp.IsZero() && !now.IsZero() {
		m["heartbeat_age_seconds"] = now.Sub(n.Timestamp).Seconds()
	}
	if n.FenceAfter > 0 {
		m["fence_after_ms"] = n.FenceAfter.Milliseconds()
	}
	if n.Dead {
		m["dead_at"], m["dead_by"] = n.DeadAt, n.DeadBy
	}
	if n.Serves != nil { // said by nodes of this version
		m["serves"], m["full"], m["wakeup_stream"] = n.Serves, n.Full, n.WakeupStream
	}
	return m
}

// envNode is disbatchd's variable for its node's name, which drain takes
// when given no NAME (a Kubernetes preStop hook runs in the node's
// container).
const envNode = "DISBATCH_NODE"

func newNodeDrain(g *globals) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "drain [NAME]",
		Short: "Ask a node to stop claiming and exit when its running tasks finish",
		Long: `Ask the node NAME to drain: it stops claiming new tasks at its next
heartbeat (within a second), lets the tasks it runs finish, then exits with
status 0. Its node document shows state "draining" meanwhile and "stopped"
after. Nothing it runs is killed or handed back. A node started again later
is not drained: the request is for the run that sees it.

Without NAME, the node named by ` + envNode + ` (disbatchd's own variable): so a
Kubernetes preStop hook in the node's container can run
"disbatch node drain --wait 1h" (deployments/kubernetes/disbatchd.yaml).

With --wait, it waits until the node says it has stopped (exit 0), or the
wait is over (exit code 3), or the node is declared dead (exit 1).

The request is drain: true on the node's document in the nodes collection.`,
		Example: `  disbatch node drain worker-3
  disbatch node drain worker-3 --wait 30m
  disbatch node list`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("want at most 1 argument (NAME), got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := g.io.Getenv(envNode)
			if len(args) == 1 {
				name = args[0]
			}
			if name == "" {
				return usagef("node name is empty (give NAME, or set %s)", envNode)
			}
			if wait < 0 {
				return usagef("--wait %s: want 0 or more", wait)
			}
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			n, err := s.NodeDrain(cmd.Context(), store.NodeDrainParams{Node: name})
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no node named %q has ever written a heartbeat to this database (see disbatch node list)", name)
			}
			if err != nil {
				return err
			}
			switch {
			case n.State == schema.NodeStateStopped:
				fmt.Fprintf(g.io.Out, "node %s says it has stopped; there is nothing to drain (a later start of it is not drained)\n", n.Node)
				return nil
			case n.Dead:
				fmt.Fprintf(g.io.Out, "node %s was declared dead; the drain request applies if it comes back\n", n.Node)
				return nil
			default:
				fmt.Fprintf(g.io.Out, "asked node %s to drain: it stops claiming within a heartbeat and exits when its %d running task(s) finish\n", n.Node, running(n))
			}
			if wait == 0 {
				return nil
			}
			return waitDrained(cmd.Context(), g, s, name, wait, time.Second)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the node to stop (exit code 3 if it has not), e.g. 30m; 0: do not wait")
	return cmd
}

// nodeReader reads a node's document (waitDrained's store).
type nodeReader interface {
	NodeGet(ctx context.Context, name string) (schema.Node, error)
}

// waitDrained waits for the node to say it has stopped, reading its
// document every poll.
func waitDrained(ctx context.Context, g *globals, s nodeReader, name string, wait, poll time.Duration) error {
	deadline := time.Now().Add(wait)
	last := int64(-1)
	for {
		// Each read has its own deadline: one cut short by the wait's end
		// would fail the command rather than say the wait is over.
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		n, err := s.NodeGet(rctx, name)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			// A failover or a network blip: read again until the wait is
			// over (a preStop hook that gave up would let SIGTERM cut the
			// node's tasks short).
			fmt.Fprintf(g.io.Err, "disbatch: read node %s (reading again): %v\n", name, err)
		case n.State == schema.NodeStateStopped:
			fmt.Fprintf(g.io.Out, "node %s has stopped\n", name)
			return nil
		case n.Dead:
			return fmt.Errorf("node %s was declared dead before it stopped", name)
		case running(n) != last:
			last = running(n)
			fmt.Fprintf(g.io.Out, "node %s: %d running task(s) to finish\n", name, last)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return &exitError{code: ExitTimeout, err: fmt.Errorf("node %s has not stopped after %s", name, wait)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(poll, left)):
		}
	}
}

// nodeMaxThreads is the cap a node runs under: the lower of its own (its
// --maxthreads, from its heartbeat) and the operator's (maxthreads on its
// document), saying which; "-" for none.
func nodeMaxThreads(n schema.Node) string {
	own, op := n.OwnMaxThreads, n.MaxThreads
	switch {
	case own == nil && op == nil:
		return "-"
	case op == nil:
		return strconv.Itoa(*own)
	case own == nil || *op < *own:
		return strconv.Itoa(*op) + " (set)"
	}
	return strconv.Itoa(*own)
}
