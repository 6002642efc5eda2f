// Package events turns one MongoDB change stream over the tasks and queues
// collections into typed events on an in-process Watermill bus, so that a
// node wakes up within milliseconds of a new task instead of polling.
//
// The stream is filtered on the server to what matters: task inserts,
// replaces and deletes, task updates that touch status (or queue), and every
// change to queues. Each becomes a TaskChanged or QueueChanged on
// TopicTasks / TopicQueues. When the stream cannot tell what happened (its
// history was lost, the collection was dropped, the stream was invalidated)
// a Rescan is published on TopicRescan: subscribers must then re-read the
// database instead of relying on events.
//
// The stream's resume token, including the post-batch token of empty
// batches, is saved at most once per SaveEvery and on Stop, so a restarted
// node resumes where it left off. Resumable errors and primary step-downs
// resume from the last token with exponential backoff; a lost history
// (ChangeStreamHistoryLost, an invalid token) starts afresh with a Rescan.
//
// Change streams only return majority-committed writes: a task inserted
// with write concern majority is seen about a millisecond later, one
// inserted with w:1 only after the journal's group commit (about 100 ms on a
// single-member replica set).
package events
