package apiv1

import (
	"encoding/json"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// The JSON shapes of the responses, as components.schemas of openapi.json
// describes them.

// Queue is a queue.
type Queue struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Plugin      string   `json:"plugin"`
	MaxThreads  *int     `json:"maxthreads"`
	Sort        string   `json:"sort"`
	NodesPin    []string `json:"nodes_pin"`
	NodesIgnore []string `json:"nodes_ignore"`
	Counts      Counts   `json:"counts"`
}

// Counts are a queue's tasks by status. Queued (status <= -2, orphaned
// included, as Disbatch 4.103 counts them), Finished (> 0) and Total come
// from the queue's counters (count_todo, count_total), which the nodes'
// counter projection keeps: they are null until a node has created them,
// and may trail the tasks by a moment. Running (claimed or running, -1 or
// 0) is counted at the request, for every queue in one aggregation.
type Counts struct {
	Queued   *int64 `json:"queued"`
	Running  int64  `json:"running"`
	Finished *int64 `json:"finished"`
	Total    *int64 `json:"total"`
}

func queueView(q schema.Queue, running map[bson.ObjectID]int64) Queue {
	sort := q.Sort
	if !sort.Valid() || sort == "" {
		sort = schema.SortDefault
	}
	v := Queue{
		ID:          q.ID.Hex(),
		Name:        q.Name,
		Plugin:      q.Constructor,
		MaxThreads:  q.MaxThreads,
		Sort:        string(sort),
		NodesPin:    nonNil(q.NodesPin),
		NodesIgnore: nonNil(q.NodesIgnore),
		Counts:      Counts{Running: running[q.ID]},
	}
	if q.CountTodo != nil && q.CountTotal != nil {
		todo, total := *q.CountTodo, *q.CountTotal
		queued := max(todo-v.Counts.Running, 0)
		finished := max(total-todo, 0)
		v.Counts.Queued, v.Counts.Finished, v.Counts.Total = &queued, &finished, &total
	}
	return v
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Task is a task without its output's text.
type Task struct {
	ID         string          `json:"id"`
	Queue      string          `json:"queue"`
	Status     int             `json:"status"`
	StatusName *string         `json:"status_name"`
	Node       *string         `json:"node"`
	Params     json.RawMessage `json:"params"`
	CTime      *string         `json:"ctime"`
	MTime      *string         `json:"mtime"`
	Stdout     *Output         `json:"stdout"`
	Stderr     *Output         `json:"stderr"`
}

// Output says where a task's stdout or stderr is and how large; null when
// the task has none yet. Read it from /api/v1/tasks/{id}/stdout or stderr.
type Output struct {
	// Inline: in the task document; false: a GridFS file.
	Inline bool `json:"inline"`
	// Bytes is its length; null when its GridFS file is missing.
	Bytes *int64 `json:"bytes"`
}

// statusNames are the named status codes (schema.Status).
var statusNames = map[schema.Status]bool{
	schema.StatusOrphaned: true, schema.StatusCancelled: true, schema.StatusBlocked: true, schema.StatusTerminated: true,
	schema.StatusQueued: true, schema.StatusClaimed: true, schema.StatusRunning: true, schema.StatusSucceeded: true, schema.StatusFailed: true,
}

func taskView(t store.TaskSummary) (Task, error) {
	params, err := paramsJSON(t.Parameters)
	if err != nil {
		return Task{}, err
	}
	v := Task{
		ID:     t.ID.Hex(),
		Queue:  t.Queue.Hex(),
		Status: int(t.Status),
		Params: params,
		CTime:  timeView(t.CTime),
		MTime:  timeView(t.MTime),
		Stdout: outputView(t.Stdout, t.StdoutBytes),
		Stderr: outputView(t.Stderr, t.StderrBytes),
	}
	if statusNames[t.Status] {
		name := t.Status.String()
		v.StatusName = &name
	}
	if t.Node != "" {
		v.Node = &t.Node
	}
	return v, nil
}

func outputView(o schema.Output, n int64) *Output {
	if !o.Set {
		return nil
	}
	v := &Output{Inline: !o.InGridFS()}
	if n >= 0 {
		v.Bytes = &n
	}
	return v
}

// timeView renders a time as RFC 3339 in UTC with milliseconds, or null
// for none (or one RFC 3339 cannot write).
func timeView(t time.Time) *string {
	if t.IsZero() || t.Year() < 1 || t.Year() > 9999 {
		return nil
	}
	s := t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return &s
}

// Node is an execution node, from the document it keeps with heartbeats.
type Node struct {
	ID   *string `json:"id"`
	Node string  `json:"node"`
	// Timestamp is its last heartbeat; HeartbeatAgeMS is its age by the
	// database server's clock (never the client's or this server's).
	Timestamp      *string     `json:"timestamp"`
	HeartbeatAgeMS *int64      `json:"heartbeat_age_ms"`
	State          *string     `json:"state"`
	Drain          bool        `json:"drain"`
	MaxThreads     *int        `json:"maxthreads"`
	Dead           bool        `json:"dead"`
	DeadAt         *string     `json:"dead_at"`
	DeadBy         *string     `json:"dead_by"`
	Queues         []NodeQueue `json:"queues"`
}

// NodeQueue is a queue as a node reports it in its heartbeat.
type NodeQueue struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Plugin     string `json:"plugin"`
	MaxThreads *int   `json:"maxthreads"`
	TasksTodo  int64  `json:"tasks_todo"`
	TasksDoing int64  `json:"tasks_doing"`
	TasksDone  int64  `json:"tasks_done"`
}

func nodeView(n schema.Node, now time.Time) Node {
	v := Node{
		Node:       n.Node,
		Timestamp:  timeView(n.Timestamp),
		Drain:      n.Drain,
		MaxThreads: n.MaxThreads,
		Dead:       n.Dead,
		DeadAt:     timeView(n.DeadAt),
		Queues:     make([]NodeQueue, 0, len(n.Queues)),
	}
	if !n.ID.IsZero() {
		id := n.ID.Hex()
		v.ID = &id
	}
	if v.Timestamp != nil && !now.IsZero() {
		age := max(now.Sub(n.Timestamp).Milliseconds(), 0)
		v.HeartbeatAgeMS = &age
	}
	if n.State != "" {
		v.State = &n.State
	}
	if n.DeadBy != "" {
		v.DeadBy = &n.DeadBy
	}
	for _, q := range n.Queues {
		v.Queues = append(v.Queues, NodeQueue{ID: q.ID, Name: q.Name, Plugin: q.Constructor, MaxThreads: q.MaxThreads,
			TasksTodo: q.TasksTodo, TasksDoing: q.TasksDoing, TasksDone: q.TasksDone})
	}
	return v
}
