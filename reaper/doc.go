// Package reaper recovers tasks whose node went away: claimed tasks older
// than the orphan limit, and a node's own unfinished tasks at start-up,
// become orphaned (-6) through guarded updates.
package reaper
