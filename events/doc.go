// Package events turns MongoDB change streams on the tasks and queues
// collections into typed events on an in-process Watermill bus, so that a
// node wakes up within milliseconds of a new task instead of polling. It owns
// the change-stream cursor, its resume token and its recovery (resume with
// backoff, full rescan when history is lost).
package events
