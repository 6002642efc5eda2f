// Package node composes the services of a Disbatch execution node (events,
// claimer, plugins, heartbeat, reaper, projections) and owns their start-up
// and shutdown order.
package node
