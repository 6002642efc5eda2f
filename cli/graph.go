package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// graphLineKeys are the keys of a task line of `task submit --graph`.
var graphLineKeys = []string{"ref", "queue", "parents", "on_parent_failure", "parameters"}

// graphItem is one task line of a graph submit.
type graphItem struct {
	line            int
	ref             string
	queue           string // "" : the command's QUEUE
	parents         []graphParent
	onParentFailure string
	params          bson.Raw
}

// graphParent is a ref of the input or a stored task's id.
type graphParent struct {
	ref string
	id  bson.ObjectID
}

// parseGraphItem reads one line of a graph submit.
func parseGraphItem(it item) (graphItem, string) {
	g := graphItem{line: it.line}
	elems, err := it.params.Elements()
	if err != nil {
		return g, "unreadable: " + err.Error()
	}
	for _, e := range elems {
		v := e.Value()
		switch e.Key() {
		case "ref":
			s, ok := v.StringValueOK()
			if !ok || strings.TrimSpace(s) == "" {
				return g, `"ref" must be a non-empty string`
			}
			if _, err := bson.ObjectIDFromHex(s); err == nil {
				return g, fmt.Sprintf(`"ref" %q looks like a task id; pick a name that does not`, s)
			}
			g.ref = s
		case "queue":
			s, ok := v.StringValueOK()
			if !ok || s == "" {
				return g, `"queue" must be a queue name or id`
			}
			g.queue = s
		case "parents":
			arr, ok := v.ArrayOK()
			if !ok {
				return g, `"parents" must be an array of refs (of this input) or task ids`
			}
			vals, _ := arr.Values()
			if len(vals) > schema.MaxParents {
				return g, fmt.Sprintf("%d parents; a task may have at most %d", len(vals), schema.MaxParents)
			}
			for _, pv := range vals {
				if id, ok := pv.ObjectIDOK(); ok {
					g.parents = append(g.parents, graphParent{id: id})
					continue
				}
				s, ok := pv.StringValueOK()
				if !ok || s == "" {
					return g, `"parents" must be an array of refs (of this input) or task ids`
				}
				g.parents = append(g.parents, graphParent{ref: s})
			}
		case "on_parent_failure":
			s, _ := v.StringValueOK()
			if err := schema.ValidOnParentFailure(s); err != nil || s == "" {
				return g, fmt.Sprintf(`"on_parent_failure" must be %q or %q`, schema.OnParentFailureFail, schema.OnParentFailureRun)
			}
			g.onParentFailure = s
		case "parameters":
			doc, ok := v.DocumentOK()
			if !ok {
				return g, `"parameters" must be an object`
			}
			g.params = doc
		default:
			return g, fmt.Sprintf("unknown key %q: a task line of --graph has %s", e.Key(), strings.Join(graphLineKeys, ", "))
		}
	}
	return g, ""
}

// looksLikeGraphLine: an item without --graph that has a graph line's
// shape (parameters beside ref or parents), worth a hint.
func looksLikeGraphLine(it item) bool {
	_, errP := it.params.LookupErr("parameters")
	_, errR := it.params.LookupErr("ref")
	_, errPar := it.params.LookupErr("parents")
	return errP == nil && (errR == nil || errPar == nil)
}

// resolveGraph turns graph lines into the store's graph tasks: refs to the
// ids chosen for them, queue names to ids. It reports every problem by
// line.
func resolveGraph(items []graphItem, queueOf func(ref string) (bson.ObjectID, error), ctl *store.TaskInsertControl) ([]store.GraphTask, []problem, error) {
	refs := map[string]int{} // ref -> index
	ids := make([]bson.ObjectID, len(items))
	var problems []problem
	for i, it := range items {
		ids[i] = bson.NewObjectID()
		if it.ref == "" {
			continue
		}
		if j, dup := refs[it.ref]; dup {
			problems = append(problems, problem{it.line, fmt.Sprintf("ref %q is also line %d's", it.ref, items[j].line)})
			continue
		}
		refs[it.ref] = i
	}
	queues := map[string]bson.ObjectID{}
	tasks := make([]store.GraphTask, len(items))
	for i, it := range items {
		q, ok := queues[it.queue]
		if !ok {
			var err error
			q, err = queueOf(it.queue)
			if errors.Is(err, store.ErrNotFound) {
				problems = append(problems, problem{it.line, fmt.Sprintf("no queue %q", it.queue)})
				continue
			}
			if err != nil {
				return nil, nil, err
			}
			queues[it.queue] = q
		}
		t := store.GraphTask{ID: ids[i], Queue: q, Parameters: it.params, OnParentFailure: it.onParentFailure, Control: ctl, Ref: it.ref}
		for _, par := range it.parents {
			switch j, isRef := refs[par.ref]; {
			case !par.id.IsZero():
				t.Parents = append(t.Parents, par.id)
			case isRef:
				t.Parents = append(t.Parents, ids[j]) // itself: the store refuses it
			default:
				id, err := bson.ObjectIDFromHex(par.ref)
				if err != nil {
					problems = append(problems, problem{it.line, fmt.Sprintf("parent %q is neither a ref of this input nor a task id", par.ref)})
					continue
				}
				t.Parents = append(t.Parents, id)
			}
		}
		tasks[i] = t
	}
	return tasks, problems, nil
}

// submitGraph is `task submit --graph`: every line resolved and the whole
// graph checked before one insert.
func submitGraph(cmd *cobra.Command, g *globals, s *store.Store, q schema.Queue, name string, items []item, ctl *store.TaskInsertControl, asJSON bool) error {
	var lines []graphItem
	var problems []problem
	for _, it := range items {
		gi, msg := parseGraphItem(it)
		if msg != "" {
			problems = append(problems, problem{it.line, msg})
			continue
		}
		lines = append(lines, gi)
	}
	var tasks []store.GraphTask
	if len(problems) == 0 {
		var err error
		tasks, problems, err = resolveGraph(lines, func(ref string) (bson.ObjectID, error) {
			if ref == "" {
				return q.ID, nil
			}
			qq, err := s.QueueGet(cmd.Context(), store.QueueGetParams{Ref: ref})
			return qq.ID, err
		}, ctl)
		if err != nil {
			return err
		}
	}
	if len(problems) > 0 {
		reportProblems(g.io.Err, name, problems)
		return fmt.Errorf("%d of %d task lines in %s are invalid; nothing was inserted", len(problems), len(items), name)
	}
	ctx, span := tracing.Tracer().Start(cmd.Context(), "disbatch.submit", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("disbatch.queue", q.Name), attribute.String("disbatch.queue.id", q.ID.Hex()),
			attribute.Int("disbatch.tasks", len(tasks)), attribute.Bool("disbatch.graph", true)))
	traceparent, tracestate := tracing.Inject(ctx)
	ids, err := s.TaskInsertGraph(ctx, store.TaskInsertGraphParams{Tasks: tasks, TraceParent: traceparent, TraceState: tracestate})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "submit failed")
		span.End()
		var ge *store.GraphInputError
		if errors.As(err, &ge) {
			reportProblems(g.io.Err, name, []problem{{lines[ge.Task].line, ge.Msg}})
			return fmt.Errorf("the task graph in %s is invalid; nothing was inserted", name)
		}
		return err
	}
	span.End()
	refs := map[string]string{}
	for i, t := range tasks {
		if t.Ref != "" {
			refs[t.Ref] = ids[i].Hex()
		}
	}
	if asJSON {
		out := map[string]any{"queue": q.Name, "queue_id": q.ID.Hex(), "submitted": len(ids), "ids": hexes(ids), "refs": refs}
		if ctl != nil {
			addInsertControl(out, *ctl)
		}
		return writeJSON(g.io.Out, out)
	}
	fmt.Fprintf(g.io.Out, "submitted a graph of %d tasks (first %s, last %s)%s\n", len(ids), ids[0].Hex(), ids[len(ids)-1].Hex(), describeInsertControl(ctl))
	names := make([]string, 0, len(refs))
	for r := range refs {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		fmt.Fprintf(g.io.Out, "  %s\t%s\n", refs[r], r)
	}
	return nil
}

func newTaskGraph(g *globals) *cobra.Command {
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "graph ID",
		Short: "Show a task's ancestors and descendants with their statuses",
		Long: `Show the task graph around one task: its ancestors (through parents, farthest
first), the task itself, and its descendants (nearest first), one line each
with its depth (negative: an ancestor), status, reason, queue and parents.
A task held for its parents is "blocked (parents)"; one whose parent failed
ended "failed" with reason parent_failed. At most --limit tasks are shown.`,
		Example: `  disbatch task graph 6572c0ffee0123456789abcd
  disbatch task graph 6572c0ffee0123456789abcd --json`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if limit < 1 || limit > store.MaxGraphView {
				return usagef("--limit must be from 1 to %d", store.MaxGraphView)
			}
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			view, err := s.TaskGraphGet(cmd.Context(), store.TaskGraphGetParams{ID: id, Limit: limit})
			if err != nil {
				return err
			}
			queueNames := map[bson.ObjectID]string{}
			if res, err := s.QueueList(cmd.Context()); err == nil {
				for _, q := range res.Queues {
					queueNames[q.ID] = q.Name
				}
			}
			queueName := func(q bson.ObjectID) string {
				if n, ok := queueNames[q]; ok {
					return n
				}
				return q.Hex()
			}
			if asJSON {
				nodes := make([]map[string]any, len(view.Nodes))
				for i, n := range view.Nodes {
					m := map[string]any{"id": n.ID.Hex(), "depth": n.Depth, "queue": n.Queue.Hex(), "queue_name": queueName(n.Queue),
						"status": int(n.Status), "status_name": n.Status.String(), "parents": hexes(n.Parents), "awaiting_parents": n.AwaitingParents}
					if n.Reason != "" {
						m["reason"] = n.Reason
					}
					if n.OnParentFailure != "" {
						m["on_parent_failure"] = n.OnParentFailure
					}
					nodes[i] = m
				}
				return writeJSON(g.io.Out, map[string]any{"id": id.Hex(), "tasks": nodes, "truncated": view.Truncated})
			}
			var tw table
			tw.row("DEPTH", "ID", "STATUS", "REASON", "QUEUE", "PARENTS")
			for _, n := range view.Nodes {
				st := n.Status.String()
				if n.AwaitingParents {
					st += " (parents)"
				}
				mark := fmt.Sprintf("%+d", n.Depth)
				if n.Depth == 0 {
					mark = "0 *"
				}
				ps := strings.Join(hexes(n.Parents), ",")
				if ps == "" {
					ps = "-"
				}
				tw.row(mark, strings.Repeat("  ", abs(n.Depth))+n.ID.Hex(), st, dash(n.Reason), queueName(n.Queue), ps)
			}
			if err := tw.print(g.io.Out); err != nil {
				return err
			}
			if view.Truncated {
				fmt.Fprintf(g.io.Out, "(more than %d tasks: the farthest are not shown; raise --limit)\n", limit)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the graph as JSON")
	cmd.Flags().IntVar(&limit, "limit", 1000, "show at most this many tasks")
	return cmd
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
