package store

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// cursorReadTimeout bounds the reading of a cursor's replies after the
// first (see cursorReader).
const cursorReadTimeout = time.Minute

// cursorReader reads a cursor's replies after the first without the
// caller's context, which it checks between documents instead, and closes
// the cursor without it. A getMore cut off by a context that ends (a
// stopping node, an HTTP client gone) leaves the server's cursor open for
// ten minutes, and the driver, believing it gone, does not kill it. The
// reads are bounded by cursorReadTimeout instead.
type cursorReader struct {
	ctx    context.Context // the caller's: checked between documents
	rd     context.Context // the replies' reads
	cancel context.CancelFunc
	cur    *mongo.Cursor
}

// readCursor starts reading cur for a caller whose context is ctx. Close it.
func readCursor(ctx context.Context, cur *mongo.Cursor) *cursorReader {
	rd, cancel := context.WithTimeout(context.WithoutCancel(ctx), cursorReadTimeout)
	return &cursorReader{ctx: ctx, rd: rd, cancel: cancel, cur: cur}
}

// Next moves to the next document (cur.Current), false once there is
// none, an error came, or the caller's context has ended.
func (r *cursorReader) Next() bool {
	if r.ctx.Err() != nil {
		return false
	}
	return r.cur.Next(r.rd)
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
	_ = r.cur.Close(r.rd)
	r.cancel()
}

// readAllInto decodes every document of cur into results, as
// mongo.Cursor.All does, read as a cursorReader reads, and closes cur.
func readAllInto(ctx context.Context, cur *mongo.Cursor, results any) error {
	r := readCursor(ctx, cur)
	defer r.Close()
	if err := cur.All(r.rd, results); err != nil {
		return err
	}
	return ctx.Err()
}
