package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/control"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// parseFuture reads a time given as RFC 3339 or as +DURATION from now.
func parseFuture(flag, s string, now time.Time) (time.Time, error) {
	if rest, ok := strings.CutPrefix(s, "+"); ok {
		d, err := time.ParseDuration(rest)
		if err != nil || d < 0 {
			return time.Time{}, usagef("%s %q: want +DURATION from now (e.g. +90m, +2h) or an RFC 3339 time", flag, s)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, usagef("%s %q: want an RFC 3339 time (e.g. 2030-01-02T15:04:05Z) or +DURATION from now (e.g. +2h)", flag, s)
	}
	return t, nil
}

// parsePast reads a time given as RFC 3339 or as a DURATION meaning that
// long ago.
func parsePast(flag, s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, usagef("%s %q: a duration means that long ago and must not be negative", flag, s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, usagef("%s %q: want an RFC 3339 time (e.g. 2030-01-02T15:04:05Z) or a duration meaning that long ago (e.g. 2h)", flag, s)
	}
	return t, nil
}

// parseIDs reads task ids, drops repeats, and refuses more than a request
// takes.
func parseIDs(args []string) ([]bson.ObjectID, error) {
	if len(args) > store.MaxControlIDs {
		return nil, usagef("%d task ids: at most %d at once; select more tasks with a filter (--queue, --status, ...)", len(args), store.MaxControlIDs)
	}
	ids := make([]bson.ObjectID, 0, len(args))
	seen := make(map[bson.ObjectID]bool, len(args))
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// parseID reads a task id given as an argument.
func parseID(arg string) (bson.ObjectID, error) {
	id, err := bson.ObjectIDFromHex(arg)
	if err != nil {
		return id, usagef("task id %q is not an ObjectId (24 hex digits)", arg)
	}
	return id, nil
}

// targetFlags name the tasks of a kill, cancel or retry: ids as arguments,
// or a filter of flags (every one given must match).
type targetFlags struct {
	queue, node, reason, since, until string
	statuses                          []string
	withReason                        bool // --reason filters (retry); kill and cancel use it for their own reason
}

func (f *targetFlags) add(cmd *cobra.Command, withReason bool) {
	f.withReason = withReason
	fl := cmd.Flags()
	fl.StringVar(&f.queue, "queue", "", "filter: tasks of this queue (a name or an id)")
	fl.StringSliceVar(&f.statuses, "status", nil, "filter: tasks with one of these statuses (names or numbers; repeat the flag or separate with commas)")
	fl.StringVar(&f.node, "node", "", "filter: tasks of this node")
	if withReason {
		fl.StringVar(&f.reason, "reason", "", "filter: tasks with this reason: "+strings.Join(schema.Reasons, ", "))
	}
	fl.StringVar(&f.since, "since", "", "filter: tasks last changed at or after TIME (RFC 3339, or a duration meaning that long ago: 2h)")
	fl.StringVar(&f.until, "until", "", "filter: tasks last changed before TIME (RFC 3339, or a duration meaning that long ago)")
}

// target reads the ids or the filter, without connecting. The filter's
// queue is left for resolveQueue.
func (f *targetFlags) target(cmd *cobra.Command, args []string, now time.Time) (store.TaskTarget, error) {
	names := []string{"queue", "status", "node", "since", "until"}
	if f.withReason {
		names = append(names, "reason")
	}
	var given []string
	for _, n := range names {
		if cmd.Flags().Changed(n) {
			given = append(given, "--"+n)
		}
	}
	switch {
	case len(args) > 0 && len(given) > 0:
		return store.TaskTarget{}, usagef("give task ids or a filter (%s), not both", strings.Join(given, ", "))
	case len(args) == 0 && len(given) == 0:
		return store.TaskTarget{}, usagef("name the tasks: task ids, or a filter (--queue, --status, --node, --since, --until%s)", map[bool]string{true: ", --reason"}[f.withReason])
	case len(args) > 0:
		ids, err := parseIDs(args)
		return store.TaskTarget{IDs: ids}, err
	}
	var flt store.TaskFilter
	checked := []struct{ name, val string }{{"queue", f.queue}, {"node", f.node}, {"since", f.since}, {"until", f.until}}
	if f.withReason {
		// retry's --reason filters; kill's and cancel's is their own text.
		checked = append(checked, struct{ name, val string }{"reason", f.reason})
	}
	for _, v := range checked {
		if cmd.Flags().Changed(v.name) && strings.TrimSpace(v.val) == "" {
			return store.TaskTarget{}, usagef("--%s is empty", v.name)
		}
	}
	if cmd.Flags().Changed("status") && len(f.statuses) == 0 {
		return store.TaskTarget{}, usagef("--status is empty")
	}
	for _, s := range f.statuses {
		st, err := schema.ParseStatus(strings.TrimSpace(s))
		if err != nil {
			return store.TaskTarget{}, usagef("--status: %w", err)
		}
		if !slices.Contains(flt.Statuses, st) {
			flt.Statuses = append(flt.Statuses, st)
		}
	}
	if f.reason != "" && !slices.Contains(schema.Reasons, f.reason) {
		return store.TaskTarget{}, usagef("--reason %q: want one of %s", f.reason, strings.Join(schema.Reasons, ", "))
	}
	flt.Reason, flt.Node = f.reason, f.node
	var err error
	if f.since != "" {
		if flt.Since, err = parsePast("--since", f.since, now); err != nil {
			return store.TaskTarget{}, err
		}
	}
	if f.until != "" {
		if flt.Until, err = parsePast("--until", f.until, now); err != nil {
			return store.TaskTarget{}, err
		}
	}
	if !flt.Since.IsZero() && !flt.Until.IsZero() && !flt.Since.Before(flt.Until) {
		return store.TaskTarget{}, usagef("--since (%s) is not before --until (%s): no task could match", flt.Since.UTC().Format(time.RFC3339), flt.Until.UTC().Format(time.RFC3339))
	}
	return store.TaskTarget{Filter: &flt}, nil
}

// resolveQueue looks up the filter's --queue.
func (f *targetFlags) resolveQueue(ctx context.Context, s *store.Store, t store.TaskTarget) error {
	if t.Filter == nil || f.queue == "" {
		return nil
	}
	q, err := s.QueueGet(ctx, store.QueueGetParams{Ref: f.queue})
	if err != nil {
		return err
	}
	t.Filter.Queue = q.ID
	return nil
}

// controlCmd is what kill, cancel and retry share: the target, --by, --json.
type controlCmd struct {
	g      *globals
	target targetFlags
	asJSON bool
}

func (c *controlCmd) add(cmd *cobra.Command, withReasonFilter bool) {
	c.target.add(cmd, withReasonFilter)
	cmd.Flags().BoolVar(&c.asJSON, "json", false, "print the result as JSON")
}

// outcome is what a control command did: the counts to print, the ids
// left alone, how many of those are failures, and what failed (e.g.
// "could not be killed").
type outcome struct {
	counts  []count
	skipped []store.TaskSkip
	failed  int
	what    string
}

// runE is a control command's RunE: it reads the target, connects,
// resolves the filter's queue, acts and reports.
func (c *controlCmd) runE(act func(ctx context.Context, s *store.Store, t store.TaskTarget) (outcome, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		t, err := c.target.target(cmd, args, time.Now())
		if err != nil {
			return err
		}
		s, done, err := c.g.open(cmd)
		if err != nil {
			return err
		}
		defer done()
		if err := c.target.resolveQueue(cmd.Context(), s, t); err != nil {
			return err
		}
		o, err := act(cmd.Context(), s, t)
		if err != nil {
			return err
		}
		return c.report(o)
	}
}

// report prints counts and skips, as text or JSON, and returns an error
// (exit 1) naming how many ids failed when any did.
func (c *controlCmd) report(o outcome) error {
	counts, skipped, failed, what := o.counts, o.skipped, o.failed, o.what
	w := c.g.io.Out
	if c.asJSON {
		m := map[string]any{}
		for _, n := range counts {
			m[n.key] = n.n
		}
		sk := make([]map[string]string, 0, len(skipped))
		for _, s := range skipped {
			sk = append(sk, map[string]string{"id": s.ID.Hex(), "why": s.Why})
		}
		m["skipped"] = sk
		if err := writeJSON(w, m); err != nil {
			return err
		}
	} else {
		width := 0
		for _, n := range counts {
			width = max(width, len(n.key))
		}
		for _, n := range counts {
			fmt.Fprintf(w, "%-*s %d %s\n", width, n.key, n.n, n.note)
		}
		for _, s := range skipped {
			fmt.Fprintf(w, "skipped %s: %s\n", s.ID.Hex(), s.Why)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d task id(s) %s (see above)", failed, what)
	}
	return nil
}

type count struct {
	key  string
	n    int64
	note string
}

func newTaskKill(g *globals) *cobra.Command {
	c := &controlCmd{g: g}
	var reason string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "kill [ID...] [--queue Q] [--status S] [--node N] [--reason TEXT]",
		Short: "Kill tasks: running ones by their node, queued ones cancelled",
		Long: `Kill tasks named by id (at most 1000) or by a filter (--queue, --status,
--node, --since, --until; every one given must match).

- running: its node kills the plugin, its process group and all, and the
  task finishes failed (status 2) with reason killed;
- claimed, not started yet: its node does not start it (same outcome);
- queued or held: cancelled at once (status 2, reason cancelled);
- orphaned: finished at once as killed;
- finished: left alone.
Each kill is recorded on the task with who asked (--by), when and why
(--reason). Asking again for a task already being killed changes nothing.

It prints how many kills were requested from nodes, cancelled and settled,
then one line per id left alone and why. It exits 1 when an id was left
alone for any reason but a kill already under way (no such task, already
finished, ...), so that scripts notice; a filter matching nothing is not an
error. --dry-run prints what it would do, and changes nothing.`,
		Example: `  disbatch task kill 6572c0ffee0123456789abcd --reason "stuck on a lock"
  disbatch task kill --queue demo --status running --node worker-3 --dry-run`,
		RunE: c.runE(func(ctx context.Context, s *store.Store, t store.TaskTarget) (outcome, error) {
			res, err := s.TaskKill(ctx, store.TaskKillParams{Target: t, By: g.who(), Reason: reason, DryRun: dryRun})
			if err != nil {
				return outcome{}, err
			}
			// A kill already under way is what was asked for; any other
			// id left alone is a failure.
			failed := 0
			for _, sk := range res.Skipped {
				if sk.Code != store.SkipUnderway {
					failed++
				}
			}
			counts := []count{
				{"requested", res.Requested, "running or claimed: their nodes kill them"},
				{"cancelled", res.Cancelled, "had not started"},
				{"settled", res.Settled, "orphaned: finished as killed"},
			}
			if dryRun {
				counts = dryCounts(counts)
			}
			return outcome{counts, res.Skipped, failed, "could not be killed"}, nil
		}),
	}
	c.add(cmd, false)
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the kill")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be killed; change nothing")
	return cmd
}

// dryCounts are counts as a dry run says them: what would be done.
func dryCounts(counts []count) []count {
	out := make([]count, len(counts))
	for i, c := range counts {
		out[i] = count{"would be " + c.key, c.n, strings.TrimSpace(c.note + " (dry run: nothing was changed)")}
	}
	return out
}

func newTaskCancel(g *globals) *cobra.Command {
	c := &controlCmd{g: g}
	var reason string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "cancel [ID...] [--queue Q] [--status S] [--reason TEXT]",
		Short: "Cancel tasks that have not started",
		Long: `Cancel tasks named by id (at most 1000) or by a filter (--queue, --status,
--node, --since, --until; every one given must match).

Only tasks that have not started are cancelled: queued, held (delayed or
blocked) and unclaimed. They finish unrun: status 2, reason cancelled, with
who asked (--by), when and why (--reason) recorded. Claimed and running tasks
are left alone (kill them instead), and so are finished and orphaned ones.

It prints how many were cancelled, then one line per id left alone and why.
It exits 1 when any id was left alone (no such task, already finished,
running, ...), so that scripts notice; a filter matching nothing is not an
error. --dry-run prints what it would do, and changes nothing.`,
		Example: `  disbatch task cancel 6572c0ffee0123456789abcd
  disbatch task cancel --queue demo --status queued --reason "wrong input file" --dry-run`,
		RunE: c.runE(func(ctx context.Context, s *store.Store, t store.TaskTarget) (outcome, error) {
			res, err := s.TaskCancel(ctx, store.TaskCancelParams{Target: t, By: g.who(), Reason: reason, DryRun: dryRun})
			if err != nil {
				return outcome{}, err
			}
			counts := []count{{"cancelled", res.Cancelled, "had not started"}}
			if dryRun {
				counts = dryCounts(counts)
			}
			return outcome{counts, res.Skipped, len(res.Skipped), "could not be cancelled"}, nil
		}),
	}
	c.add(cmd, false)
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the cancel")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be cancelled; change nothing")
	return cmd
}

func newTaskRetry(g *globals) *cobra.Command {
	c := &controlCmd{g: g}
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "retry [ID...] [--queue Q] [--status S] [--reason R] [--since T] [--until T] [--node N]",
		Short: "Put finished or orphaned tasks back in their queue",
		Long: `Requeue tasks named by id (at most 1000) or by a filter: --queue, --status
(names or numbers, e.g. failed,orphaned), --reason, --node, and --since and
--until bounding when the task last changed (RFC 3339, or a duration meaning
that long ago: --since 2h). Every filter flag given must match, and at least
one is needed: there is no "retry everything". Reasons are
` + strings.Join(schema.Reasons, ", ") + `.

Finished tasks (status > 0) and orphaned ones (-6) go back to the queue
(status -2, reason requeued, who asked recorded) with their kill request,
delay, expiry and spent retries cleared; their attempts history stays. Tasks
not finished are left alone: queued ones will run anyway, and claimed or
running ones belong to their node.

A filter's tasks are requeued 1000 at a time with a progress bar on stderr; an
interrupted retry can simply be run again. --dry-run prints how many would be
requeued and changes nothing. It exits 1 when any id was left alone.

A requeued task runs whatever its own parents (task graphs); its descendants
that had ended with reason parent_failed are held again (status -4) until
their parents allow them ("blocked again").`,
		Example: `  disbatch task retry --queue demo --status failed --since 2h --dry-run
  disbatch task retry --queue demo --reason orphaned
  disbatch task retry 6572c0ffee0123456789abcd`,
		RunE: c.runE(func(ctx context.Context, s *store.Store, t store.TaskTarget) (outcome, error) {
			p := store.TaskRetryParams{Target: t, By: g.who(), DryRun: dryRun}
			if t.Filter != nil && !dryRun {
				p.Progress = newProgress(g.io.Err, g.io.ErrTerminal, "requeued").update
			}
			res, err := s.TaskRetry(ctx, p)
			if err != nil {
				return outcome{}, err
			}
			n := count{"requeued", res.Requeued, ""}
			if dryRun {
				n = count{"would requeue", res.Requeued, "(dry run: nothing was changed)"}
			}
			counts := []count{n}
			if res.Reblocked > 0 {
				counts = append(counts, count{"blocked again", res.Reblocked, "(descendants that had ended with parent_failed, waiting for their parents again)"})
			}
			return outcome{counts, res.Skipped, len(res.Skipped), "could not be requeued"}, nil
		}),
	}
	c.add(cmd, true)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print how many tasks would be requeued; change nothing")
	return cmd
}

func newTaskWait(g *globals) *cobra.Command {
	var timeout time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "wait ID... [--timeout DURATION]",
		Short: "Wait until tasks have ended; exit 0 if all succeeded",
		Long: `Wait until every task named (at most 1000) has ended, then print one line per
task: its id, its status, and its reason if it has one. A task has ended when
it finished (status > 0) or was orphaned (-6: its node went away; it stays so
until an operator retries or kills it), or when it does not exist.

--timeout bounds the wait (0, the default: no limit); when it passes first,
the tasks not ended yet are shown as "still <status>".

Exit codes: 0 every task succeeded (status 1); 1 a task failed, was
orphaned or does not exist (or an error); 2 usage error; 3 the timeout
passed before every task ended.`,
		Example: `  disbatch task wait 6572c0ffee0123456789abcd --timeout 10m && echo done`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want at least one task ID")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout < 0 {
				return usagef("--timeout must not be negative, got %s", timeout)
			}
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			states, err := control.Wait(ctx, s, ids)
			timedOut := err != nil && ctx.Err() != nil && cmd.Context().Err() == nil
			if err != nil && !timedOut {
				return err
			}
			if err := printStates(g.io.Out, states, asJSON); err != nil {
				return err
			}
			bad := 0
			for _, st := range states {
				if !st.Found || st.Status != schema.StatusSucceeded {
					bad++
				}
			}
			switch {
			case timedOut:
				pending := 0
				for _, st := range states {
					if !control.Ended(st) {
						pending++
					}
				}
				return &exitError{code: ExitTimeout, err: fmt.Errorf("timed out after %s: %d of %d task(s) have not ended", timeout, pending, len(states))}
			case !control.Succeeded(states):
				return fmt.Errorf("%d of %d task(s) did not succeed", bad, len(states))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long, e.g. 30s or 2h (exit code 3); 0: no limit")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func printStates(w io.Writer, states []store.TaskState, asJSON bool) error {
	if asJSON {
		out := make([]map[string]any, 0, len(states))
		for _, st := range states {
			m := map[string]any{"id": st.ID.Hex(), "found": st.Found, "ended": control.Ended(st)}
			if st.Found {
				m["status"], m["status_name"] = int(st.Status), st.Status.String()
				if st.Reason != "" {
					m["reason"] = st.Reason
				}
				if st.Node != "" {
					m["node"] = st.Node
				}
				m["kill_requested"] = st.Kill
			}
			out = append(out, m)
		}
		return writeJSON(w, out)
	}
	for _, st := range states {
		fmt.Fprintf(w, "%s %s\n", st.ID.Hex(), describeState(st))
	}
	return nil
}

func describeState(st store.TaskState) string {
	if !st.Found {
		return "not found"
	}
	var b strings.Builder
	if !control.Ended(st) {
		b.WriteString("still ")
	}
	b.WriteString(st.Status.String())
	if !st.Status.Finished() && st.Node != "" {
		fmt.Fprintf(&b, " on node %s", st.Node)
	}
	if st.Reason != "" {
		fmt.Fprintf(&b, " (reason %s)", st.Reason)
	}
	if st.Kill && !st.Status.Finished() {
		b.WriteString(" (kill requested)")
	}
	return b.String()
}
