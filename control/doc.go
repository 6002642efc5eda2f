// Package control carries out what an operator asks of tasks beyond
// submitting them, for the CLI and the HTTP API alike: waiting for tasks
// to end (driven by a change stream on exactly those tasks, with a
// once-a-second re-read as the safety net), and checking requests before
// the store's guarded writes (kill, cancel, retry) run them.
//
// The requests themselves are document changes (store.TaskKill,
// TaskCancel, TaskRetry); the node that must act hears them from its own
// wake-up change stream (store.StreamWakeups).
package control
