// Package schema holds the Disbatch 4 wire format (seed 000): the documents of
// the queues, tasks, nodes and config collections, their exact BSON field
// names, and the task status codes.
//
// Decoding is deliberately tolerant, because the same database is shared
// with the Disbatch 4.103 Perl node and clients and with hand-written
// documents:
//
//   - fields may be missing or null;
//   - numbers may be stored as int32, int64 or an integral double;
//   - the Perl dialect is understood: queues with "plugin" for "constructor"
//     and "threads" for "maxthreads", tasks with "params" for "parameters",
//     unclaimed tasks with node null instead of -1, and mtime stored as epoch
//     seconds instead of a date.
//
// A document that cannot be understood gives a *DecodeError naming the
// collection, the _id and the field; decoding never panics. Non-fatal oddities
// (an unknown sort, maxthreads and threads that disagree) are reported as
// Warnings on the decoded value so that callers can log them once.
//
// Decoded values keep the whole original document in Raw. The store never
// writes a whole document back: every write is a $set of the fields it owns,
// so fields this package does not know are never dropped.
package schema

// Collection names.
const (
	CollQueues      = "queues"
	CollTasks       = "tasks"
	CollNodes       = "nodes"
	CollConfig      = "config"
	CollTasksFiles  = "tasks.files"
	CollTasksChunks = "tasks.chunks"
	// CollReports holds Disbatch 4.103's Demo plugin's reports.
	CollReports = "reports"
)
