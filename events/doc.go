// Package events turns the node's change stream over the tasks and queues
// collections into typed events on an in-process Watermill bus, so that a
// node wakes up within milliseconds of a new task instead of polling.
//
// The stream is the store's reader with the profile store.StreamWakeups,
// filtered on the server to what makes work: task inserts, replaces and
// deletes, task updates that queue a task or move it to another queue, and
// every change to queues. Each becomes a TaskChanged or QueueChanged on
// TopicTasks / TopicQueues. When the stream cannot tell what happened (its
// position was lost, the collection was dropped, the stream was
// invalidated) a Rescan is published on TopicRescan: subscribers must then
// re-read the database instead of relying on events.
//
// The reader saves the stream's position, including the post-batch token
// of empty batches, at most once per SaveEvery and at Stop, so a restarted
// node resumes where it left off; it resumes interruptions and primary
// step-downs by itself, and Stop kills its server cursor.
//
// Change streams only return majority-committed writes: a task inserted
// with write concern majority is seen about a millisecond later, one
// inserted with w:1 only after the journal's group commit (about 100 ms on a
// single-member replica set).
package events
