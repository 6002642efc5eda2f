package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"golang.org/x/term"

	"github.com/disbatch-go/disbatch/schema"
)

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// extJSON renders a document as relaxed extended JSON, which is plain JSON
// for ordinary values.
func extJSON(d bson.Raw) json.RawMessage {
	if d == nil {
		return json.RawMessage("null")
	}
	b, err := bson.MarshalExtJSON(d, false, false)
	if err != nil {
		return json.RawMessage(`"(unprintable)"`)
	}
	return b
}

func fmtTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// taskJSON is a task for scripts: ids as hex strings, times as RFC 3339.
func taskJSON(t schema.Task, stdout, stderr *string) map[string]any {
	node := any(t.Node)
	if t.Node == "" {
		node = schema.Unclaimed
	}
	m := map[string]any{
		"id":          t.ID.Hex(),
		"queue":       t.Queue.Hex(),
		"status":      int(t.Status),
		"status_name": t.Status.String(),
		"node":        node,
		"ctime":       fmtTime(t.CTime),
		"mtime":       fmtTime(t.MTime),
		"parameters":  extJSON(t.Parameters),
	}
	addControlJSON(m, t)
	if r, ok := t.Raw.Lookup(schema.TaskResult).AsInt64OK(); ok {
		m["result"] = r // exec's and shell's exit code
	}
	if s, ok := t.Raw.Lookup(schema.TaskMixedout).StringValueOK(); ok {
		m["mixedout"] = s
	}
	if s, ok := t.Raw.Lookup(schema.TaskThenError).StringValueOK(); ok && s != "" {
		m["then_error"] = s
	}
	if stdout != nil {
		m["stdout"] = *stdout
	}
	if stderr != nil {
		m["stderr"] = *stderr
	}
	return m
}

// addControlJSON adds the control fields a task has to its JSON.
func addControlJSON(m map[string]any, t schema.Task) {
	c := t.Control
	if c.Reason != "" {
		m["reason"] = c.Reason
	}
	if c.Timeout > 0 {
		m["timeout"] = c.Timeout.Seconds()
	}
	if !c.NotBefore.IsZero() {
		m["not_before"] = fmtTime(c.NotBefore)
	}
	if !c.ExpiresAt.IsZero() {
		m["expires_at"] = fmtTime(c.ExpiresAt)
	}
	if c.Priority != 0 {
		m["priority"] = c.Priority
	}
	if k := c.Kill; k != nil {
		m["kill"] = map[string]any{"node": k.Node, "by": k.By, "at": fmtTime(k.At), "reason": k.Reason}
	}
	for _, f := range []string{schema.TaskCancel, schema.TaskRequeued} {
		if r := operatorRecord(t.Raw, f); r != nil {
			m[f] = map[string]any{"by": r.by, "at": fmtTime(r.at), "reason": r.reason}
		}
	}
	if len(t.Graph.Parents) > 0 {
		m["parents"] = hexes(t.Graph.Parents)
		m["awaiting_parents"] = t.Graph.AwaitingParents
	}
	if t.Graph.OnParentFailure != "" {
		m["on_parent_failure"] = t.Graph.OnParentFailure
	}
	if c.Attempt > 0 {
		m["attempt"] = c.Attempt
	}
	if c.Tries > 0 {
		m["tries"] = c.Tries
	}
	if len(c.Attempts) > 0 {
		as := make([]map[string]any, 0, len(c.Attempts))
		for _, a := range c.Attempts {
			e := map[string]any{"node": a.Node, "claimed": fmtTime(a.Claimed), "started": fmtTime(a.Started),
				"finished": fmtTime(a.Finished), "status": int(a.Status), "status_name": a.Status.String()}
			if a.Reason != "" {
				e["reason"] = a.Reason
			}
			as = append(as, e)
		}
		m["attempts"] = as
	}
}

// record is an operator's cancel or requeue of a task ({by, at, reason}).
type record struct {
	by, reason string
	at         time.Time
}

// operatorRecord reads the {by, at, reason} object under field, or nil.
func operatorRecord(raw bson.Raw, field string) *record {
	doc, ok := raw.Lookup(field).DocumentOK()
	if !ok {
		return nil
	}
	r := &record{}
	r.by, _ = doc.Lookup(schema.KillBy).StringValueOK()
	r.reason, _ = doc.Lookup(schema.KillReason).StringValueOK()
	r.at, _ = doc.Lookup(schema.KillAt).TimeOK()
	return r
}

// writeControl prints the control fields a task has, for task show.
func writeControl(w io.Writer, t schema.Task) {
	c := t.Control
	line := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-12s%s\n", name+":", fmt.Sprintf(format, args...))
	}
	if c.Reason != "" {
		line("reason", "%s", c.Reason)
	}
	if c.Timeout > 0 {
		line("timeout", "%s", c.Timeout)
	}
	if !c.NotBefore.IsZero() {
		line("not_before", "%s", fmtTime(c.NotBefore))
	}
	if !c.ExpiresAt.IsZero() {
		line("expires_at", "%s", fmtTime(c.ExpiresAt))
	}
	if c.Priority != 0 {
		line("priority", "%d", c.Priority)
	}
	if k := c.Kill; k != nil {
		node := k.Node
		if node == "" {
			node = "- (none: it had not been claimed)"
		}
		line("kill", "requested by %s at %v%s; node %s", k.By, fmtTime(k.At), because(k.Reason), node)
	}
	for _, f := range []string{schema.TaskCancel, schema.TaskRequeued} {
		if r := operatorRecord(t.Raw, f); r != nil {
			line(f, "by %s at %v%s", r.by, fmtTime(r.at), because(r.reason))
		}
	}
	if c.Attempt > 0 || len(c.Attempts) > 0 || c.Tries > 0 {
		tries := ""
		if c.Tries > 0 {
			tries = fmt.Sprintf(" (%d failed since submitted or requeued: the queue's retries spent)", c.Tries)
		}
		line("attempts", "%d ended%s", c.Attempt, tries)
		first := c.Attempt - len(c.Attempts) + 1
		if first < 1 {
			first = 1
		}
		for i, a := range c.Attempts {
			parts := []string{fmt.Sprintf("#%d node %s", first+i, dash(a.Node))}
			for _, tm := range []struct {
				name string
				t    time.Time
			}{{"claimed", a.Claimed}, {"started", a.Started}, {"finished", a.Finished}} {
				if !tm.t.IsZero() {
					parts = append(parts, fmt.Sprintf("%s %v", tm.name, fmtTime(tm.t)))
				}
			}
			parts = append(parts, "status "+a.Status.String())
			if a.Reason != "" {
				parts = append(parts, "reason "+a.Reason)
			}
			fmt.Fprintf(w, "  %s\n", strings.Join(parts, "  "))
		}
	}
}

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return fmt.Sprintf(": %q", reason)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// hexes renders ids as hex strings.
func hexes(ids []bson.ObjectID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.Hex()
	}
	return out
}
