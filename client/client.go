// Package client submits tasks to a Disbatch database from Go programs.
//
// Submit writes tasks exactly as seed 000 describes them, with write concern
// majority (so change-stream nodes see them within milliseconds), and with
// the W3C trace context of ctx's span in each task's traceparent and
// tracestate fields, so the node's spans for the task join the caller's
// trace.
//
//	c := client.New(mongoClient.Database("disbatch"))
//	ctx, span := tracer.Start(ctx, "nightly migration")
//	ids, err := c.Submit(ctx, "demo", bson.D{{Key: "commands", Value: "a"}})
//	span.End()
package client

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// Client submits tasks to one database.
type Client struct {
	s *store.Store
}

// New returns a client for db.
func New(db *mongo.Database) *Client { return &Client{s: store.New(db, store.Options{})} }

// Submit inserts one task per parameters object (a bson.D, bson.M, struct
// or bson.Raw) into the queue named by ref (a name or an id), in order,
// and returns their ids.
func (c *Client) Submit(ctx context.Context, ref string, params ...any) ([]bson.ObjectID, error) {
	q, err := c.s.QueueGet(ctx, store.QueueGetParams{Ref: ref})
	if err != nil {
		return nil, err
	}
	raws := make([]bson.Raw, len(params))
	for i, p := range params {
		if raws[i], err = bson.Marshal(p); err != nil {
			return nil, fmt.Errorf("parameters %d: %w", i, err)
		}
	}
	traceparent, tracestate := tracing.Inject(ctx)
	return c.s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: raws, TraceParent: traceparent, TraceState: tracestate})
}
