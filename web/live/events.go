package live

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// kind is what an event is about; kinds are bits of a filter.
type kind uint8

const (
	kindTask kind = 1 << iota
	kindQueue
	kindNode
	kindControl // reset: every subscriber gets it, whatever its filter

	kindsAll = kindTask | kindQueue | kindNode
)

// item is one event ready for the wire: its frame is encoded once and
// shared by every subscriber it goes to.
type item struct {
	id    string // the event id ("" for none)
	kind  kind
	task  bson.ObjectID // task events: the task, when an ObjectId
	queue bson.ObjectID // task and queue events: the queue, when known
	// from is a task's queue before the change, when it moved.
	from                       bson.ObjectID
	hasTask, hasQueue, hasFrom bool
	frame                      []byte
	// Set by the hub: the event's cluster time, and its index among the
	// events of that cluster time (a transaction's) in the hub's stream.
	at  bson.Timestamp
	idx int
}

// encodeID makes an event id of a resume token: base64url (no padding) of
// its BSON bytes.
func encodeID(tok bson.Raw) string {
	if tok == nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(tok)
}

var errBadID = errors.New("not an event id of this stream (ids are the opaque `id:` values of its events)")

// decodeID reads an event id back into a resume token.
func decodeID(id string) (bson.Raw, error) {
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil || len(b) < 5 {
		return nil, errBadID
	}
	tok := bson.Raw(b)
	if tok.Validate() != nil {
		return nil, errBadID
	}
	if _, ok := tok.Lookup("_data").StringValueOK(); !ok {
		return nil, errBadID
	}
	return tok, nil
}

// frame renders one SSE event: id, event and a one-line data.
func frame(id, event string, data []byte) []byte {
	b := make([]byte, 0, len(id)+len(event)+len(data)+24)
	if id != "" {
		b = append(b, "id: "...)
		b = append(b, id...)
		b = append(b, '\n')
	}
	b = append(b, "event: "...)
	b = append(b, event...)
	b = append(b, "\ndata: "...)
	b = append(b, data...)
	return append(b, '\n', '\n')
}

type clusterTime struct {
	T uint32 `json:"t"`
	I uint32 `json:"i"`
}

// header is what every change event's data starts with.
type header struct {
	Type        string          `json:"type"`
	Op          string          `json:"op"`
	ID          json.RawMessage `json:"id"`
	Time        string          `json:"time"`
	ClusterTime clusterTime     `json:"cluster_time"`
}

type taskData struct {
	header
	Queue     json.RawMessage `json:"queue"`
	FromQueue json.RawMessage `json:"from_queue,omitempty"`
	From      *int64          `json:"from"`
	To        *int64          `json:"to"`
	Node      *string         `json:"node"`
}

type queueData struct {
	header
	Name    *string         `json:"name"`
	Fields  json.RawMessage `json:"fields,omitempty"`
	Removed []string        `json:"removed,omitempty"`
}

type nodeData struct {
	header
	Node       *string         `json:"node"`
	State      json.RawMessage `json:"state,omitempty"`
	Drain      json.RawMessage `json:"drain,omitempty"`
	MaxThreads json.RawMessage `json:"maxthreads,omitempty"`
	Dead       json.RawMessage `json:"dead,omitempty"`
}

type resetData struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type laggedData struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Resume  string `json:"resume"`
}

const resetMessage = "events were lost: what changed before this event is unknown; re-read the queues, tasks and nodes, and go on from here"

// resetItem says events were lost (or the collections were dropped).
func resetItem(id, reason string) *item {
	data, _ := json.Marshal(resetData{Type: "reset", Reason: reason, Message: resetMessage})
	return &item{id: id, kind: kindControl, frame: frame(id, "reset", data)}
}

// laggedFrame tells a dropped subscriber where to resume.
func laggedFrame(buffer int, resume string) []byte {
	data, _ := json.Marshal(laggedData{
		Type: "lagged",
		Message: "this client fell more than " + strconv.Itoa(buffer) + " events behind and was disconnected; " +
			"reconnect with Last-Event-ID (the resume id) to go on without loss",
		Resume: resume,
	})
	return frame("", "lagged", data)
}

// names remembers the names of queues and nodes by _id, for the update and
// delete events that do not carry them. Only the hub's own reader (which
// follows the present) changes it; replays read it.
type names struct {
	mu     sync.RWMutex
	queues map[bson.ObjectID]string
	nodes  map[bson.ObjectID]string
}

func newNames() *names {
	return &names{queues: map[bson.ObjectID]string{}, nodes: map[bson.ObjectID]string{}}
}

func (n *names) get(m map[bson.ObjectID]string, id bson.RawValue) *string {
	oid, ok := id.ObjectIDOK()
	if !ok {
		return nil
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if s, ok := m[oid]; ok {
		return &s
	}
	return nil
}

func (n *names) set(m map[bson.ObjectID]string, id bson.RawValue, name *string) {
	if oid, ok := id.ObjectIDOK(); ok {
		n.setID(m, oid, name)
	}
}

func (n *names) setID(m map[bson.ObjectID]string, oid bson.ObjectID, name *string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if name == nil {
		delete(m, oid)
	} else {
		m[oid] = *name
	}
}

// convert turns a change event into an item, or nil for one subscribers
// are not told about (an invalidate, a queue's counter update). learn: the
// event is the present (the hub's reader), so the name caches follow it.
// resolve returns the name an event carries, else the one remembered for
// its document; with learn it remembers the name (forgets it on delete).
func (n *names) resolve(m map[bson.ObjectID]string, ev store.ChangeEvent, carried *string, learn bool) *string {
	name := carried
	if name == nil {
		name = n.get(m, ev.ID)
	}
	if learn {
		switch {
		case ev.Op == "delete":
			n.set(m, ev.ID, nil)
		case name != nil:
			n.set(m, ev.ID, name)
		}
	}
	return name
}

func convert(ev store.ChangeEvent, nm *names, learn bool) *item {
	id := encodeID(ev.Token)
	switch ev.Op {
	case "invalidate":
		return nil // follows a drop, which was a reset already
	case "drop", "rename":
		return resetItem(id, "the "+ev.Coll+" collection was "+map[string]string{"drop": "dropped", "rename": "renamed"}[ev.Op])
	case "dropDatabase":
		return resetItem(id, "the database was dropped")
	}
	h := header{Op: ev.Op, ID: jsonValue(ev.ID), Time: ev.WallTime.UTC().Format(time.RFC3339Nano),
		ClusterTime: clusterTime{T: ev.ClusterTime.T, I: ev.ClusterTime.I}}
	switch ev.Coll {
	case schema.CollTasks:
		return taskItem(id, h, ev)
	case schema.CollQueues:
		return queueItem(id, h, ev, nm, learn)
	case schema.CollNodes:
		return nodeItem(id, h, ev, nm, learn)
	}
	return nil
}

func taskItem(id string, h header, ev store.ChangeEvent) *item {
	h.Type = "task"
	it := &item{id: id, kind: kindTask}
	it.task, it.hasTask = ev.ID.ObjectIDOK()
	d := taskData{header: h}
	// after is where the task's fields stand after the change, before
	// where they stood (pre-image); an update changes only what it names.
	var after bson.Raw
	switch ev.Op {
	case "insert", "replace":
		after = ev.Doc
	case "update":
		after = ev.Updated
	}
	lookup := func(field string) (before, now bson.RawValue) {
		if ev.Before != nil {
			before = ev.Before.Lookup(field)
		}
		switch {
		case ev.Op == "delete":
		case ev.Op != "update":
			if after != nil {
				now = after.Lookup(field)
			}
		default:
			if v, err := after.LookupErr(field); err == nil {
				now = v
			} else if !removed(ev.Removed, field) {
				now = before // unchanged
			}
		}
		return before, now
	}
	bs, as := lookup(schema.TaskStatus)
	if ev.Op != "insert" {
		d.From = status(bs)
	}
	d.To = status(as)
	bq, aq := lookup(schema.TaskQueue)
	q := aq
	if ev.Op == "delete" {
		q = bq
	}
	d.Queue = jsonValue(q)
	it.queue, it.hasQueue = q.ObjectIDOK()
	if ev.Op != "insert" && ev.Op != "delete" && bq.Type != 0 && !bq.Equal(q) {
		d.FromQueue = jsonValue(bq)
		it.from, it.hasFrom = bq.ObjectIDOK()
	}
	bn, an := lookup(schema.TaskNode)
	if ev.Op == "delete" {
		an = bn
	}
	d.Node = nodeName(an)
	data, _ := json.Marshal(d)
	it.frame = frame(id, "task", data)
	return it
}

// Queue fields that are projections of the tasks, not the queue's own
// settings: they change with every batch of transitions and are left out
// of queue events (and an update of nothing else sends none).
var counterFields = map[string]bool{schema.QueueCountTodo: true, schema.QueueCountTotal: true, schema.QueueCountRunning: true, schema.QueueCountFailed: true,
	schema.QueueCountsApplied: true}

func queueItem(id string, h header, ev store.ChangeEvent, nm *names, learn bool) *item {
	h.Type = "queue"
	it := &item{id: id, kind: kindQueue}
	it.queue, it.hasQueue = ev.ID.ObjectIDOK()
	d := queueData{header: h}
	var fields bson.Raw
	switch ev.Op {
	case "insert", "replace":
		fields = ev.Doc
	case "update":
		fields = ev.Updated
		for _, f := range ev.Removed {
			if !counterFields[f] {
				d.Removed = append(d.Removed, f)
			}
		}
	}
	var kept bson.D
	if fields != nil {
		elems, _ := fields.Elements()
		for _, e := range elems {
			if k := e.Key(); k != "_id" && !counterFields[k] {
				kept = append(kept, bson.E{Key: k, Value: e.Value()})
			}
		}
	}
	if ev.Op == "update" && len(kept) == 0 && len(d.Removed) == 0 {
		return nil // counters only
	}
	if kept != nil {
		d.Fields, _ = bson.MarshalExtJSON(kept, false, false)
	}
	if fields != nil {
		if n, ok := fields.Lookup(schema.QueueName).StringValueOK(); ok {
			d.Name = &n
		}
	}
	d.Name = nm.resolve(nm.queues, ev, d.Name, learn)
	data, _ := json.Marshal(d)
	it.frame = frame(id, "queue", data)
	return it
}

func nodeItem(id string, h header, ev store.ChangeEvent, nm *names, learn bool) *item {
	h.Type = "node"
	d := nodeData{header: h}
	var doc bson.Raw
	whole := ev.Op == "insert" || ev.Op == "replace"
	switch {
	case whole:
		doc = ev.Doc
	case ev.Op == "update":
		doc = ev.Updated
	}
	field := func(name string, conv func(bson.RawValue) json.RawMessage, removedAs json.RawMessage) json.RawMessage {
		if doc != nil {
			if v, err := doc.LookupErr(name); err == nil {
				return conv(v)
			}
		}
		if whole || (ev.Op == "update" && removed(ev.Removed, name)) {
			return removedAs
		}
		return nil
	}
	null, falseJSON := json.RawMessage("null"), json.RawMessage("false")
	d.State = field(schema.NodeState, func(v bson.RawValue) json.RawMessage {
		if s, ok := v.StringValueOK(); ok {
			return quote(s)
		}
		return null
	}, null)
	d.Drain = field(schema.NodeDrain, boolJSON, falseJSON)
	d.Dead = field(schema.NodeDead, boolJSON, falseJSON)
	d.MaxThreads = field(schema.NodeMaxThreads, func(v bson.RawValue) json.RawMessage {
		if n, ok := integer(v); ok {
			return json.RawMessage(strconv.FormatInt(n, 10))
		}
		return null
	}, null)
	if doc != nil {
		if n, ok := doc.Lookup(schema.NodeNode).StringValueOK(); ok {
			d.Node = &n
		}
	}
	d.Node = nm.resolve(nm.nodes, ev, d.Node, learn)
	data, _ := json.Marshal(d)
	return &item{id: id, kind: kindNode, frame: frame(id, "node", data)}
}

func removed(list []string, field string) bool {
	for _, f := range list {
		if f == field {
			return true
		}
	}
	return false
}

// status reads a status code; nil when absent or not an integer.
func status(v bson.RawValue) *int64 {
	if n, ok := integer(v); ok {
		return &n
	}
	return nil
}

// nodeName reads a task's node: nil when unclaimed (-1, null) or absent.
func nodeName(v bson.RawValue) *string {
	if s, ok := v.StringValueOK(); ok {
		return &s
	}
	return nil
}

func integer(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32()), true
	case bson.TypeInt64:
		return v.Int64(), true
	case bson.TypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
			return int64(f), true
		}
	}
	return 0, false
}

func boolJSON(v bson.RawValue) json.RawMessage {
	if b, ok := v.BooleanOK(); ok {
		return json.RawMessage(strconv.FormatBool(b))
	}
	if n, ok := integer(v); ok { // an operator's 1 or 0
		return json.RawMessage(strconv.FormatBool(n != 0))
	}
	return json.RawMessage("false")
}

func quote(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// jsonValue renders an _id or a field: an ObjectId as its hex string, an
// absent value as null, anything else as relaxed extended JSON.
func jsonValue(v bson.RawValue) json.RawMessage {
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined:
		return json.RawMessage("null")
	case bson.TypeObjectID:
		return quote(v.ObjectID().Hex())
	case bson.TypeString:
		return quote(v.StringValue())
	}
	doc, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false)
	if err != nil {
		return json.RawMessage("null")
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(doc, &m) != nil || m["v"] == nil {
		return json.RawMessage("null")
	}
	return m["v"]
}
