package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// maxParamsSize keeps a task document under MongoDB's 16 MiB limit with room
// for the fields the node adds.
const maxParamsSize = 16<<20 - 64<<10

// item is one parameters object of the input and where it came from.
type item struct {
	line   int
	params bson.Raw
}

// problem is one invalid input item.
type problem struct {
	line int
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("line %d: %s", p.line, p.msg) }

// reportProblems writes the first 20 problems of input name, one a line.
func reportProblems(w io.Writer, name string, problems []problem) {
	for i, p := range problems {
		if i == 20 {
			fmt.Fprintf(w, "%s: ... and %d more invalid items\n", name, len(problems)-i)
			break
		}
		fmt.Fprintf(w, "%s: %s\n", name, p)
	}
}

// parseTasks reads parameters objects as JSON lines (one object per line;
// blank lines are ignored) or as one JSON array of objects. Values may use
// MongoDB extended JSON ({"$oid": ...}, {"$date": ...}). It returns the
// valid items and a problem for each invalid one; err is set only when the
// input cannot be read at all.
func parseTasks(r io.Reader) ([]item, []problem, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, nil, fmt.Errorf("read input: %w", err)
	}
	trimmed := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return parseArray(data)
	}
	var items []item
	var problems []problem
	for lineNo, rest := 1, data; len(rest) > 0; lineNo++ {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if p, msg := toParams(line); msg != "" {
			problems = append(problems, problem{lineNo, msg})
		} else {
			items = append(items, item{lineNo, p})
		}
	}
	return items, problems, nil
}

func parseArray(data []byte) ([]item, []problem, error) {
	lineAt := func(off int64) int { return 1 + bytes.Count(data[:min(int(off), len(data))], []byte{'\n'}) }
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // [
		return nil, []problem{{1, "invalid JSON: " + err.Error()}}, nil
	}
	var items []item
	var problems []problem
	for dec.More() {
		// The element starts after the white space and comma that follow
		// the previous token.
		start := int(dec.InputOffset())
		for start < len(data) && bytes.IndexByte([]byte(" \t\r\n,"), data[start]) >= 0 {
			start++
		}
		line := lineAt(int64(start))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			// The array itself is broken: nothing after this can be trusted.
			problems = append(problems, problem{line, "invalid JSON: " + err.Error()})
			return items, problems, nil
		}
		if p, msg := toParams(raw); msg != "" {
			problems = append(problems, problem{line, msg})
		} else {
			items = append(items, item{line, p})
		}
	}
	if _, err := dec.Token(); err != nil { // ]
		problems = append(problems, problem{lineAt(dec.InputOffset()), "invalid JSON: the array is not closed: " + err.Error()})
	}
	return items, problems, nil
}

// toParams converts one JSON value to a parameters document, or says why
// it cannot be one.
func toParams(b []byte) (bson.Raw, string) {
	b = bytes.TrimSpace(b)
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return nil, "invalid JSON: " + err.Error()
	}
	if b[0] != '{' {
		kind := map[byte]string{'[': "an array", '"': "a string", 't': "a boolean", 'f': "a boolean", 'n': "null"}[b[0]]
		if kind == "" {
			kind = "a number"
		}
		return nil, "parameters must be a JSON object, got " + kind
	}
	var raw bson.Raw
	if err := bson.UnmarshalExtJSON(b, false, &raw); err != nil {
		return nil, "cannot convert to BSON: " + err.Error()
	}
	if len(raw) > maxParamsSize {
		return nil, fmt.Sprintf("parameters are %d bytes as BSON, over the %d allowed (MongoDB documents are limited to 16 MiB)", len(raw), maxParamsSize)
	}
	return raw, ""
}

func newTaskSubmit(g *globals) *cobra.Command {
	var skipInvalid, asJSON, graph bool
	var batchSize, parallel int
	var timeout time.Duration
	var expiresAt, notBefore string
	var priority int64
	cmd := &cobra.Command{
		Use:   "submit QUEUE [FILE|-]",
		Short: "Submit tasks: one parameters object each, from a file or stdin",
		Long: `Submit tasks to QUEUE (a name or an id). Each task is one JSON object of
parameters, read from FILE or from stdin (no FILE, or -) either as JSON lines
(one object per line; blank lines are ignored) or as one JSON array of
objects. MongoDB extended JSON is understood ({"$oid": ...}, {"$date": ...}).

Every item is checked before anything is inserted; invalid ones are reported
by line number and nothing is inserted unless --skip-invalid is given. Tasks
are inserted in batches with write concern majority (so that nodes see them
at once: change streams only deliver majority-committed writes), in input
order: with sort fifo they run oldest first.

Every task of one submit may get the same control fields (Disbatch 4 nodes
ignore them):
  --timeout DURATION  its time limit once started (overrides the queue's):
                      its node kills it then and it fails with reason timeout
  --not-before TIME   it is held (status -4) until then, then queued
  --expires-at TIME   if not started by then it fails unrun, reason expired
  --priority N        on a queue whose sort is priority, higher runs first
                      (then older); 0, the default, runs after all others
TIME is an RFC 3339 time (2030-01-02T15:04:05Z) or +DURATION from now (+90m).

With --graph, each line is a task of a graph (seed 002), submitted whole in
one call, of the keys (all optional):
  {"ref": "build", "queue": "other", "parents": ["fetch", "6572c0ffee0123456789abcd"],
   "on_parent_failure": "run", "parameters": {...}}
ref names the task within the input; parents are refs of the input or ids of
stored tasks (of any queue); queue (a name or an id) overrides QUEUE. A task
is held (status -4) until every parent has succeeded, then queued; if a
parent fails it finishes unrun (reason parent_failed) unless
on_parent_failure is "run" (it then runs once every parent has ended).
Unknown refs, duplicate refs, self-parents, cycles, unknown tasks or queues
and more than ` + fmt.Sprint(schema.MaxParents) + ` parents are reported by line, and nothing is inserted.`,
		Example: `  printf '{"commands":"a"}\n{"commands":"ab"}\n' | disbatch task submit demo
  disbatch task submit demo tasks.json
  disbatch task submit demo tasks.json --timeout 10m --not-before +1h --expires-at +6h
  printf '{"ref":"a"}\n{"ref":"b","parents":["a"]}\n' | disbatch task submit demo --graph`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("want QUEUE and optionally FILE (or - for stdin)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if batchSize < 1 || batchSize > 100000 {
				return usagef("--batch-size must be between 1 and 100000")
			}
			if parallel < 1 || parallel > 64 {
				return usagef("--parallel must be between 1 and 64")
			}
			ctl, err := submitControl(time.Now(), timeout, notBefore, expiresAt, priority)
			if err != nil {
				return err
			}
			in := g.io.In
			name := "stdin"
			if len(args) == 2 && args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return fmt.Errorf("open input: %w", err)
				}
				defer f.Close()
				in, name = f, args[1]
			}
			s, q, done, err := g.openQueue(cmd, args[0])
			if err != nil {
				return err
			}
			defer done()
			items, problems, err := parseTasks(in)
			if err != nil {
				return err
			}
			if graph {
				if skipInvalid {
					return usagef("--skip-invalid does not go with --graph: a graph is inserted whole or not at all")
				}
				if len(problems) > 0 {
					reportProblems(g.io.Err, name, problems)
					return fmt.Errorf("%d items in %s are invalid; nothing was inserted", len(problems), name)
				}
				if len(items) == 0 {
					return fmt.Errorf("no tasks in %s: want JSON objects, one per line, or a JSON array of objects", name)
				}
				return submitGraph(cmd, g, s, q, name, items, ctl, asJSON)
			}
			for _, it := range items {
				if looksLikeGraphLine(it) {
					fmt.Fprintf(g.io.Err, "%s: line %d has \"parameters\" beside \"ref\" or \"parents\": submitted as parameters; for a task graph use --graph\n", name, it.line)
					break
				}
			}
			reportProblems(g.io.Err, name, problems)
			if len(problems) > 0 && !skipInvalid {
				return fmt.Errorf("%d of %d items in %s are invalid; nothing was inserted (fix them, or use --skip-invalid to insert the %d valid ones)",
					len(problems), len(problems)+len(items), name, len(items))
			}
			if len(items) == 0 {
				return fmt.Errorf("no tasks in %s: want JSON objects, one per line, or a JSON array of objects", name)
			}
			// One span for the submit; every task carries its trace context,
			// so each task's execution spans join this trace.
			ctx, span := tracing.Tracer().Start(cmd.Context(), "disbatch.submit", trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithAttributes(attribute.String("disbatch.queue", q.Name), attribute.String("disbatch.queue.id", q.ID.Hex()), attribute.Int("disbatch.tasks", len(items))))
			ids, err := insertBatches(ctx, s, q.ID, ctl, items, batchSize, parallel, g.progress(len(items)))
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, "submit failed")
				span.End()
				return err
			}
			span.End()
			if asJSON {
				out := map[string]any{"queue": q.Name, "queue_id": q.ID.Hex(), "submitted": len(ids), "skipped": len(problems), "first": ids[0].Hex(), "last": ids[len(ids)-1].Hex()}
				if ctl != nil {
					addInsertControl(out, *ctl)
				}
				return writeJSON(g.io.Out, out)
			}
			skipped := ""
			if len(problems) > 0 {
				skipped = fmt.Sprintf(", skipped %d invalid", len(problems))
			}
			fmt.Fprintf(g.io.Out, "submitted %d tasks to queue %s%s (first %s, last %s)%s\n", len(ids), q.Name, skipped, ids[0].Hex(), ids[len(ids)-1].Hex(), describeInsertControl(ctl))
			return nil
		},
	}
	cmd.Flags().BoolVar(&skipInvalid, "skip-invalid", false, "insert the valid items even if some are invalid")
	cmd.Flags().IntVar(&batchSize, "batch-size", 1000, "tasks per insert")
	cmd.Flags().IntVar(&parallel, "parallel", 4, "inserts in flight at once")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().BoolVar(&graph, "graph", false, "each line is a task of a graph: {ref, queue, parents, on_parent_failure, parameters}")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "each task's time limit once started, e.g. 30s or 2h (0: the queue's)")
	cmd.Flags().StringVar(&notBefore, "not-before", "", "hold the tasks until TIME (RFC 3339, or +DURATION from now)")
	cmd.Flags().Int64Var(&priority, "priority", 0, "each task's priority, on a queue sorted by priority: higher first (0 to 2147483647)")
	cmd.Flags().StringVar(&expiresAt, "expires-at", "", "tasks not started by TIME (RFC 3339, or +DURATION from now) fail unrun, reason expired")
	return cmd
}

// submitControl checks submit's control flags and returns the control
// fields for the tasks, or nil when none is given.
func submitControl(now time.Time, timeout time.Duration, notBefore, expiresAt string, priority int64) (*store.TaskInsertControl, error) {
	if timeout < 0 {
		return nil, usagef("--timeout must not be negative, got %s", timeout)
	}
	if priority < 0 || priority > schema.MaxTaskPriority {
		return nil, usagef("--priority must be from 0 to %d, got %d", schema.MaxTaskPriority, priority)
	}
	c := store.TaskInsertControl{Timeout: timeout, Priority: priority}
	var err error
	if notBefore != "" {
		if c.NotBefore, err = parseFuture("--not-before", notBefore, now); err != nil {
			return nil, err
		}
	}
	if expiresAt != "" {
		if c.ExpiresAt, err = parseFuture("--expires-at", expiresAt, now); err != nil {
			return nil, err
		}
		if !c.ExpiresAt.After(now) {
			return nil, usagef("--expires-at %s is not in the future: the tasks would expire unrun", expiresAt)
		}
	}
	if c == (store.TaskInsertControl{}) {
		return nil, nil
	}
	if err := c.Validate(); err != nil {
		return nil, &UsageError{Err: err}
	}
	return &c, nil
}

func describeInsertControl(c *store.TaskInsertControl) string {
	if c == nil {
		return ""
	}
	var parts []string
	if !c.NotBefore.IsZero() {
		parts = append(parts, "not before "+c.NotBefore.UTC().Format(time.RFC3339))
	}
	if !c.ExpiresAt.IsZero() {
		parts = append(parts, "expiring unrun at "+c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if c.Timeout > 0 {
		parts = append(parts, "time limit "+c.Timeout.String())
	}
	if c.Priority > 0 {
		parts = append(parts, fmt.Sprintf("priority %d", c.Priority))
	}
	return "; " + strings.Join(parts, ", ")
}

func addInsertControl(m map[string]any, c store.TaskInsertControl) {
	if c.Timeout > 0 {
		m["timeout"] = c.Timeout.Seconds()
	}
	if !c.NotBefore.IsZero() {
		m["not_before"] = fmtTime(c.NotBefore)
	}
	if !c.ExpiresAt.IsZero() {
		m["expires_at"] = fmtTime(c.ExpiresAt)
	}
	if c.Priority > 0 {
		m["priority"] = c.Priority
	}
}

// progress returns a callback that draws a progress bar when stdout is a
// terminal, or nil.
func (g *globals) progress(total int) func(done int) {
	if !g.io.Terminal {
		return nil
	}
	p := newProgress(g.io.Out, true, "submitted")
	return func(done int) { p.update(int64(done), int64(total)) }
}

// insertBatches inserts items in batches, several at once. Ids are allocated
// up front in input order, so _id order (fifo) is input order whatever order
// the batches land in.
func insertBatches(ctx context.Context, s *store.Store, queue bson.ObjectID, ctl *store.TaskInsertControl, items []item, batchSize, parallel int, progress func(int)) ([]bson.ObjectID, error) {
	traceparent, tracestate := tracing.Inject(ctx)
	ids := make([]bson.ObjectID, len(items))
	for i := range ids {
		ids[i] = bson.NewObjectID()
	}
	// A failure stops the batches not yet sent; those in flight end as
	// the server ends them (a cancelled one may still be written after
	// the driver stopped waiting, and insertedLines would miss it).
	stop := make(chan struct{})
	batches := make(chan int)
	var inserted atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range batches {
				end := min(start+batchSize, len(items))
				params := make([]bson.Raw, end-start)
				for i := range params {
					params[i] = items[start+i].params
				}
				if _, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: queue, Parameters: params, IDs: ids[start:end], TraceParent: traceparent, TraceState: tracestate, Control: ctl}); err != nil {
					errOnce.Do(func() {
						firstErr = fmt.Errorf("insert tasks from input line %d on: %w", items[start].line, err)
						close(stop)
					})
					continue
				}
				n := inserted.Add(int64(end - start))
				if progress != nil {
					progress(int(n))
				}
			}
		}()
	}
send:
	for start := 0; start < len(items); start += batchSize {
		select {
		case batches <- start:
		case <-stop:
			break send
		case <-ctx.Done():
			break send
		}
	}
	close(batches)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return nil, fmt.Errorf("%w; %s", firstErr, insertedLines(ctx, s, ids, items))
	}
	return ids, nil
}

// insertedLines says which input lines became tasks after a failed
// submit: batches go in at once, a failed one keeps the tasks before its
// bad one, and others may have landed before or after it, so only the
// tasks themselves tell (their ids were allocated here). An operator
// resubmits the lines not inserted, and only those.
func insertedLines(ctx context.Context, s *store.Store, ids []bson.ObjectID, items []item) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	in := make([]bool, len(ids))
	n := 0
	for start := 0; start < len(ids); start += statesChunk {
		end := min(start+statesChunk, len(ids))
		states, err := s.TaskStates(ctx, ids[start:end])
		if err != nil {
			return fmt.Sprintf("which of the %d tasks were inserted could not be read (%v): list them with disbatch task list", len(ids), err)
		}
		for i, st := range states {
			in[start+i] = st.Found
			if st.Found {
				n++
			}
		}
	}
	if n == 0 {
		return fmt.Sprintf("none of the %d tasks was inserted", len(ids))
	}
	return fmt.Sprintf("%d of %d tasks were inserted, input lines %s; not inserted: lines %s", n, len(ids), lineRanges(items, in, true), lineRanges(items, in, false))
}

// statesChunk is how many ids insertedLines reads at a time.
const statesChunk = 10000

// lineRanges lists the input lines of the items whose in is want, as
// ranges ("3-7, 9"), the first ten of them.
func lineRanges(items []item, in []bool, want bool) string {
	var out []string
	more := 0
	for i := 0; i < len(items); i++ {
		if in[i] != want {
			continue
		}
		j := i
		for j+1 < len(items) && in[j+1] == want {
			j++
		}
		if len(out) == 10 {
			more++
		} else if j == i {
			out = append(out, strconv.Itoa(items[i].line))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", items[i].line, items[j].line))
		}
		i = j
	}
	if len(out) == 0 {
		return "none"
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("and %d more ranges", more))
	}
	return strings.Join(out, ", ")
}
