package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func newTaskCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Submit, list, show, kill, cancel, retry and wait for tasks",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTaskSubmit(g), newTaskList(g), newTaskShow(g), newTaskGraph(g),
		newTaskKill(g), newTaskCancel(g), newTaskRetry(g), newTaskWait(g))
	return cmd
}

func newTaskList(g *globals) *cobra.Command {
	var status string
	var limit int64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list QUEUE",
		Short: "List a queue's tasks, oldest first",
		Long: `List a queue's tasks (QUEUE is a name or an id), oldest first.

--status filters by status: a number or one of orphaned, queued, claimed,
running, succeeded, failed (and the former cancelled, blocked, terminated).
REASON says why a task ended or is held, when it was not as its plugin
said: ` + strings.Join(schema.Reasons, ", ") + `.`,
		Args: exactArgs("QUEUE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := store.TaskListParams{Limit: limit, WithoutOutput: true}
			if status != "" {
				st, err := schema.ParseStatus(status)
				if err != nil {
					return &UsageError{Err: err}
				}
				p.Status = &st
			}
			if limit < 0 {
				return usagef("--limit must be >= 0")
			}
			s, q, done, err := g.openQueue(cmd, args[0])
			if err != nil {
				return err
			}
			defer done()
			p.Queue = q.ID
			res, err := s.TaskList(cmd.Context(), p)
			if err != nil {
				return err
			}
			for _, m := range res.Malformed {
				fmt.Fprintln(g.io.Err, "warning: skipping", m)
			}
			if asJSON {
				out := make([]map[string]any, 0, len(res.Tasks))
				for _, t := range res.Tasks {
					out = append(out, taskJSON(t, nil, nil))
				}
				return writeJSON(g.io.Out, out)
			}
			var tw table
			tw.row("ID", "STATUS", "REASON", "NODE", "MTIME", "PARAMETERS")
			for _, t := range res.Tasks {
				node := t.Node
				if node == "" {
					node = "-"
				}
				params := clip(string(extJSON(t.Parameters)), 60)
				mtime := "-"
				if !t.MTime.IsZero() {
					mtime = t.MTime.Local().Format(time.DateTime)
				}
				reason := t.Control.Reason
				if reason == "" {
					reason = "-"
				}
				tw.row(t.ID.Hex(), t.Status.String(), reason, node, mtime, params)
			}
			return tw.print(g.io.Out)
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "only tasks with this status (name or number)")
	cmd.Flags().Int64Var(&limit, "limit", 0, "at most this many tasks (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newTaskShow(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one task with its control fields, stdout and stderr",
		Long: `Show one task with its stdout and stderr, read from GridFS when they live there.

The control fields are shown when the task has them: its reason (why it
ended or is held, when not as its plugin said), its time limit, delay and
expiry, a kill request (who asked, when, why, and the node asked to carry it
out), a cancel or requeue by an operator, and its attempts: how many ended
and the history of the last ` + fmt.Sprint(schema.MaxAttemptsKept) + ` (node, claimed, started, finished, status,
reason).`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			t, err := s.TaskGet(cmd.Context(), id)
			if err != nil {
				return err
			}
			read := func(o schema.Output) (*string, error) {
				if !o.Set {
					return nil, nil
				}
				text, err := s.TaskOutputRead(cmd.Context(), o)
				return &text, err
			}
			stdout, err := read(t.Stdout)
			if err != nil {
				return fmt.Errorf("read stdout of task %s: %w", id.Hex(), err)
			}
			stderr, err := read(t.Stderr)
			if err != nil {
				return fmt.Errorf("read stderr of task %s: %w", id.Hex(), err)
			}
			if asJSON {
				return writeJSON(g.io.Out, taskJSON(t, stdout, stderr))
			}
			queueName := t.Queue.Hex()
			if q, err := s.QueueGet(cmd.Context(), store.QueueGetParams{Ref: t.Queue.Hex()}); err == nil {
				queueName = q.Name + " (" + t.Queue.Hex() + ")"
			}
			node := t.Node
			if node == "" {
				node = "- (unclaimed)"
			}
			w := g.io.Out
			fmt.Fprintf(w, "id:         %s\n", t.ID.Hex())
			fmt.Fprintf(w, "queue:      %s\n", queueName)
			fmt.Fprintf(w, "status:     %d (%s)\n", int(t.Status), t.Status)
			fmt.Fprintf(w, "node:       %s\n", node)
			fmt.Fprintf(w, "ctime:      %v\n", fmtTime(t.CTime))
			fmt.Fprintf(w, "mtime:      %v\n", fmtTime(t.MTime))
			writeControl(w, t)
			if r, ok := t.Raw.Lookup(schema.TaskResult).AsInt64OK(); ok {
				fmt.Fprintf(w, "result:     %d (the command's exit code)\n", r)
			}
			if e, ok := t.Raw.Lookup(schema.TaskThenError).StringValueOK(); ok && e != "" {
				fmt.Fprintf(w, "then error: %s\n", e)
			}
			fmt.Fprintf(w, "parameters: %s\n", extJSON(t.Parameters))
			for _, o := range []struct {
				name string
				text *string
				out  schema.Output
			}{{"stdout", stdout, t.Stdout}, {"stderr", stderr, t.Stderr}} {
				where := ""
				if o.out.InGridFS() {
					where = " (GridFS " + o.out.FileID.Hex() + ")"
				}
				if o.text == nil {
					fmt.Fprintf(w, "%s:     null\n", o.name)
					continue
				}
				fmt.Fprintf(w, "%s:%s\n%s\n", o.name, where, indent(*o.text))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the task as JSON")
	return cmd
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "  (empty)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
