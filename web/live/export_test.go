package live

// SetMaxBatch bounds the batches of h's change streams (before Start), so
// that tests can split a transaction's events across batches.
func SetMaxBatch(h *Hub, n int) { h.maxBatch = n }
