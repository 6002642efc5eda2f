package supervisor

// message is one line of JSON either way on the socket.
type message struct {
	Op string `json:"op"`
	// hello (supervisor → node): the task, the supervisor's pid and
	// protocol version, and whether the result is ready.
	Task    string `json:"task,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Version int    `json:"version,omitempty"`
	Done    bool   `json:"done,omitempty"`
	// Node and Database are whose task it is: a node never touches
	// another's supervisor found in its directory.
	Node     string `json:"node,omitempty"`
	Database string `json:"database,omitempty"`
	// task (node → supervisor, first): the task's spec (its id in it).
	Spec *Spec `json:"spec,omitempty"`
	// alive (node → supervisor): the send time of an acknowledged
	// heartbeat, Unix nanoseconds.
	Sent int64 `json:"sent,omitempty"`
	// kill (node → supervisor): the cause's text and the task-control
	// reason ("" for kills that are not task control).
	Text   string `json:"text,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Messages.
const (
	opTask  = "task"  // node, first: the task's Spec: go
	opHello = "hello" // supervisor: who it is; Done when the result is ready
	opDone  = "done"  // supervisor: the result is in <id>.result
	opAlive = "alive" // node: its heartbeat was acknowledged
	opKill  = "kill"  // node: kill the plugin
	opAck   = "ack"   // node: the result is written (or not the node's to write); exit
)

// protocolVersion is the hello's version: a node refuses supervisors of
// another one (after an upgrade that changed it, drain instead). 2: the
// spec and result files are JSON, and the result is the process's raw
// outcome (1: gob, and the plugin's result).
const protocolVersion = 2
