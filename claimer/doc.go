// Package claimer claims queued tasks for a node with seed 000's
// findOneAndUpdate, within the queue's and the node's maxthreads, when a
// wake-up or the fallback tick says a queue may have work.
package claimer
