// Package reaper recovers tasks whose node went away (seed 000's orphans).
//
// At start-up, before the node claims anything, the node's own tasks in -1
// (claimed) or 0 (running) were left by a previous run of the same node and
// become orphaned (-6). Then, every interval, any task claimed (-1) whose
// mtime is older than OrphanAfter (default 5 minutes) becomes orphaned: a
// claim is turned into a run within milliseconds, so an old claim means its
// node died between the two. Every update is guarded by the status it
// expects, so a task that moved on meanwhile is left alone.
package reaper
