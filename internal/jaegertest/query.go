package jaegertest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Reference types, as Jaeger reports them.
const (
	ChildOf     = "CHILD_OF"
	FollowsFrom = "FOLLOWS_FROM"
)

// tracesLimit is the most traces Traces asks for (the API's default is 100).
const tracesLimit = 1000

// ErrNotFound is returned (wrapped) by Trace for a trace Jaeger does not have.
var ErrNotFound = errors.New("trace not found")

// Trace is one trace as Jaeger's query API returns it.
type Trace struct {
	TraceID  string // lower-case hex, 32 digits for 128-bit ids
	Spans    []Span
	Warnings []string
}

// Span is one span of a Trace. Jaeger maps OTel attributes to Tags (adding
// some of its own: span.kind, otel.status_code, otel.scope.name, ...), span
// events to Logs and resource attributes (service.name aside) to
// ProcessTags.
type Span struct {
	TraceID       string
	SpanID        string // lower-case hex, 16 digits
	OperationName string
	References    []Reference
	StartTime     time.Time
	Duration      time.Duration
	// Tags holds the span's tags: string, bool, int64, float64 or []byte
	// values.
	Tags        map[string]any
	Logs        []Log
	ServiceName string         // the process's service name
	ProcessTags map[string]any // the process's tags
	Warnings    []string
}

// Reference is a span's link to another: Type is ChildOf or FollowsFrom.
type Reference struct {
	Type    string
	TraceID string
	SpanID  string
}

// Log is a span log (an OTel span event).
type Log struct {
	Time   time.Time
	Fields map[string]any
}

// Span returns the first span of t named operation.
func (t Trace) Span(operation string) (Span, bool) {
	for _, s := range t.Spans {
		if s.OperationName == operation {
			return s, true
		}
	}
	return Span{}, false
}

// SpanByID returns the span of t with the given id.
func (t Trace) SpanByID(spanID string) (Span, bool) {
	for _, s := range t.Spans {
		if s.SpanID == spanID {
			return s, true
		}
	}
	return Span{}, false
}

// ParentID returns the span id of s's first CHILD_OF reference, or "".
func (s Span) ParentID() string {
	for _, r := range s.References {
		if r.Type == ChildOf {
			return r.SpanID
		}
	}
	return ""
}

// String describes t on a few lines, one per span (for failure messages).
func (t Trace) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "trace %s (%d spans)", t.TraceID, len(t.Spans))
	for _, w := range t.Warnings {
		fmt.Fprintf(&b, " warning: %s", w)
	}
	for _, s := range t.Spans {
		fmt.Fprintf(&b, "\n  span %s %q service=%q", s.SpanID, s.OperationName, s.ServiceName)
		for _, r := range s.References {
			fmt.Fprintf(&b, " %s=%s", r.Type, r.SpanID)
		}
		fmt.Fprintf(&b, " start=%s duration=%v", s.StartTime.Format(time.RFC3339Nano), s.Duration)
		if len(s.Tags) > 0 {
			keys := make([]string, 0, len(s.Tags))
			for k := range s.Tags {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			b.WriteString(" tags={")
			for i, k := range keys {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%s: %#v", k, s.Tags[k])
			}
			b.WriteString("}")
		}
		for _, w := range s.Warnings {
			fmt.Fprintf(&b, " warning: %s", w)
		}
	}
	return b.String()
}

// Traces returns the traces (at most 1000, of the last two days) that have a
// span of service, from GET /api/traces?service=...&limit=....
func (j *Jaeger) Traces(ctx context.Context, service string) ([]Trace, error) {
	q := url.Values{"service": {service}, "limit": {strconv.Itoa(tracesLimit)}}
	var raw []apiTrace
	if err := j.get(ctx, "/api/traces?"+q.Encode(), &raw); err != nil {
		return nil, err
	}
	out := make([]Trace, 0, len(raw))
	for _, rt := range raw {
		tr, err := rt.convert()
		if err != nil {
			return nil, err
		}
		out = append(out, tr)
	}
	return out, nil
}

// Trace returns one trace by its hex id, from GET /api/traces/{id}. For a
// trace Jaeger does not have, the error wraps ErrNotFound.
func (j *Jaeger) Trace(ctx context.Context, traceID string) (Trace, error) {
	var raw []apiTrace
	if err := j.get(ctx, "/api/traces/"+url.PathEscape(traceID), &raw); err != nil {
		return Trace{}, err
	}
	if len(raw) != 1 {
		return Trace{}, fmt.Errorf("jaeger: GET /api/traces/%s: %d traces in the answer, want 1", traceID, len(raw))
	}
	return raw[0].convert()
}

// Services returns the (sorted) names of the services Jaeger has spans of,
// from GET /api/services.
func (j *Jaeger) Services(ctx context.Context) ([]string, error) {
	var services []string
	if err := j.get(ctx, "/api/services", &services); err != nil {
		return nil, err
	}
	sort.Strings(services)
	return services, nil
}

// WaitForTraces polls Traces(service) (every 100 ms) until fn returns true
// for what it returned, and returns that. After timeout it fails the test
// (t.Fatal) showing the traces it saw last (and the last error, if any).
func (j *Jaeger) WaitForTraces(t testing.TB, service string, timeout time.Duration, fn func([]Trace) bool) []Trace {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var (
		last    []Trace
		lastErr error
		polled  int
	)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(10*time.Second))
		traces, err := j.Traces(ctx, service)
		cancel()
		polled++
		if err != nil {
			lastErr = err
		} else {
			last, lastErr = traces, nil
			if fn(traces) {
				return traces
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "jaegertest: traces of service %q not as expected after %v (%d polls); last seen %d traces", service, timeout, polled, len(last))
	for _, tr := range last {
		b.WriteString("\n")
		b.WriteString(tr.String())
	}
	if lastErr != nil {
		fmt.Fprintf(&b, "\nlast poll failed: %v", lastErr)
	}
	t.Fatal(b.String())
	return nil
}

// get GETs path from the query API and decodes the "data" of its answer
// into data.
func (j *Jaeger) get(ctx context.Context, path string, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL()+path, nil)
	if err != nil {
		return err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return fmt.Errorf("jaeger: GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("jaeger: GET %s: reading the answer: %w", path, err)
	}
	if resp.StatusCode == http.StatusNotFound && strings.HasPrefix(path, "/api/traces/") {
		return fmt.Errorf("jaeger: GET %s: %w", path, ErrNotFound)
	}
	var env struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Code int    `json:"code"`
			Msg  string `json:"msg"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(body, &env); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("jaeger: GET %s: %s: %s", path, resp.Status, snippet(body))
	}
	if len(env.Errors) > 0 {
		msgs := make([]string, len(env.Errors))
		for i, e := range env.Errors {
			msgs[i] = fmt.Sprintf("%d %s", e.Code, e.Msg)
		}
		return fmt.Errorf("jaeger: GET %s: %s", path, strings.Join(msgs, "; "))
	}
	if len(env.Data) == 0 || bytes.Equal(env.Data, []byte("null")) {
		return nil
	}
	if err := json.Unmarshal(env.Data, data); err != nil {
		return fmt.Errorf("jaeger: GET %s: decoding the answer: %w", path, err)
	}
	return nil
}

func snippet(b []byte) string {
	const max = 500
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}

// The query API's JSON (Jaeger's internal/uimodel).

type apiTrace struct {
	TraceID   string                `json:"traceID"`
	Spans     []apiSpan             `json:"spans"`
	Processes map[string]apiProcess `json:"processes"`
	Warnings  []string              `json:"warnings"`
}

type apiSpan struct {
	TraceID       string         `json:"traceID"`
	SpanID        string         `json:"spanID"`
	OperationName string         `json:"operationName"`
	References    []apiReference `json:"references"`
	StartTime     int64          `json:"startTime"` // µs since the epoch
	Duration      int64          `json:"duration"`  // µs
	Tags          []apiKeyValue  `json:"tags"`
	Logs          []apiLog       `json:"logs"`
	ProcessID     string         `json:"processID"`
	Process       *apiProcess    `json:"process"`
	Warnings      []string       `json:"warnings"`
}

type apiReference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type apiProcess struct {
	ServiceName string        `json:"serviceName"`
	Tags        []apiKeyValue `json:"tags"`
}

type apiLog struct {
	Timestamp int64         `json:"timestamp"` // µs since the epoch
	Fields    []apiKeyValue `json:"fields"`
}

type apiKeyValue struct {
	Key   string          `json:"key"`
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

func (rt apiTrace) convert() (Trace, error) {
	tr := Trace{TraceID: rt.TraceID, Warnings: rt.Warnings, Spans: make([]Span, 0, len(rt.Spans))}
	for _, rs := range rt.Spans {
		s := Span{
			TraceID:       rs.TraceID,
			SpanID:        rs.SpanID,
			OperationName: rs.OperationName,
			StartTime:     time.UnixMicro(rs.StartTime),
			Duration:      time.Duration(rs.Duration) * time.Microsecond,
			Warnings:      rs.Warnings,
		}
		for _, r := range rs.References {
			s.References = append(s.References, Reference{Type: r.RefType, TraceID: r.TraceID, SpanID: r.SpanID})
		}
		var err error
		if s.Tags, err = tagMap(rs.Tags); err != nil {
			return Trace{}, fmt.Errorf("jaeger: span %s: %w", rs.SpanID, err)
		}
		for _, l := range rs.Logs {
			fields, err := tagMap(l.Fields)
			if err != nil {
				return Trace{}, fmt.Errorf("jaeger: span %s: log: %w", rs.SpanID, err)
			}
			s.Logs = append(s.Logs, Log{Time: time.UnixMicro(l.Timestamp), Fields: fields})
		}
		p := rs.Process
		if p == nil {
			if pp, ok := rt.Processes[rs.ProcessID]; ok {
				p = &pp
			}
		}
		if p != nil {
			s.ServiceName = p.ServiceName
			if s.ProcessTags, err = tagMap(p.Tags); err != nil {
				return Trace{}, fmt.Errorf("jaeger: span %s: process: %w", rs.SpanID, err)
			}
		}
		tr.Spans = append(tr.Spans, s)
	}
	return tr, nil
}

// tagMap decodes Jaeger key-values by their type: string, bool, int64 (a JSON
// number, or a string beyond ±2^53), float64, binary (base64).
func tagMap(kvs []apiKeyValue) (map[string]any, error) {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v, err := kv.decode()
		if err != nil {
			return nil, fmt.Errorf("tag %q: %w", kv.Key, err)
		}
		m[kv.Key] = v
	}
	return m, nil
}

func (kv apiKeyValue) decode() (any, error) {
	switch kv.Type {
	case "bool":
		var b bool
		err := json.Unmarshal(kv.Value, &b)
		return b, err
	case "int64":
		var n json.Number
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			return nil, err
		}
		return strconv.ParseInt(n.String(), 10, 64)
	case "float64":
		var f float64
		err := json.Unmarshal(kv.Value, &f)
		return f, err
	case "binary":
		var s string
		if err := json.Unmarshal(kv.Value, &s); err != nil {
			return nil, err
		}
		return base64.StdEncoding.DecodeString(s)
	default: // "string", or anything new
		var s string
		if err := json.Unmarshal(kv.Value, &s); err == nil {
			return s, nil
		}
		var v any
		err := json.Unmarshal(kv.Value, &v)
		return v, err
	}
}
