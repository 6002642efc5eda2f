package store

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// cursorReadTimeout bounds each of a cursor's replies after the first
// (see cursorReader), and a readAllInto's whole read.
const cursorReadTimeout = time.Minute

// cursorReader reads a cursor's replies after the first without the
// caller's context, which it checks between documents instead, and closes
// the cursor without it. A getMore cut off by a context that ends (a
// stopping node, an HTTP client gone) leaves the server's cursor open for
// ten minutes, and the driver, believing it gone, does not kill it. Each
// reply's read is bounded by cursorReadTimeout instead.
type cursorReader struct {
	ctx      context.Context // the caller's: checked between documents
	detached context.Context // ctx's values (a session), not its end
	cur      *mongo.Cursor
}

// readCursor starts reading cur for a caller whose context is ctx. Close it.
func readCursor(ctx context.Context, cur *mongo.Cursor) *cursorReader {
	return &cursorReader{ctx: ctx, detached: context.WithoutCancel(ctx), cur: cur}
}

// Next moves to the next document (cur.Current), false once there is
// none, an error came, or the caller's context has ended.
func (r *cursorReader) Next() bool {
	if r.ctx.Err() != nil {
		return false
	}
	if r.cur.RemainingBatchLength() > 0 || r.cur.ID() == 0 {
		// From the reply in hand, or the end of an exhausted cursor: no
		// round trip (and no timer on a claim's read-back, one reply).
		return r.cur.Next(r.detached)
	}
	rd, cancel := context.WithTimeout(r.detached, cursorReadTimeout)
	defer cancel()
	return r.cur.Next(rd)
}

// Err is the cursor's error, or else the caller's context's.
func (r *cursorReader) Err() error {
	if err := r.cur.Err(); err != nil {
		return err
	}
	return r.ctx.Err()
}

// Close closes the cursor (killing it on the server if it is still open).
func (r *cursorReader) Close() {
	rd, cancel := context.WithTimeout(r.detached, cursorReadTimeout)
	defer cancel()
	_ = r.cur.Close(rd)
}

// readAllInto decodes every document of cur into results, as
// mongo.Cursor.All does, its replies read without ctx (bounded by
// cursorReadTimeout in all: the sets read so are small), and closes cur.
func readAllInto(ctx context.Context, cur *mongo.Cursor, results any) error {
	rd, cancel := context.WithTimeout(context.WithoutCancel(ctx), cursorReadTimeout)
	defer cancel()
	if err := cur.All(rd, results); err != nil {
		_ = cur.Close(rd)
		return err
	}
	return ctx.Err()
}
