package cli

import (
	"encoding/json"
	"io"
	"os"
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
	if stdout != nil {
		m["stdout"] = *stdout
	}
	if stderr != nil {
		m["stderr"] = *stderr
	}
	return m
}
