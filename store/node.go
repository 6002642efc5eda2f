package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// NodeUpsertParams are what a node writes about itself every heartbeat.
type NodeUpsertParams struct {
	Node   string
	Queues []schema.NodeQueue
}

// NodeUpsert writes node, timestamp and queues of this node's document,
// creating it if needed, and returns the document as it now is (so one round
// trip also reads the operator's maxthreads). It sets only those fields:
// maxthreads and anything else an operator or another tool put there is
// never overwritten.
func (s *Store) NodeUpsert(ctx context.Context, p NodeUpsertParams) (schema.Node, error) {
	if p.Node == "" {
		return schema.Node{}, errors.New("node upsert: empty node name")
	}
	queues := p.Queues
	if queues == nil {
		queues = []schema.NodeQueue{}
	}
	for i := range queues {
		queues[i].Preemptive, queues[i].TasksBackfill = 1, 0
	}
	raw, err := s.nodes.FindOneAndUpdate(ctx,
		bson.D{{Key: schema.NodeNode, Value: p.Node}},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: schema.NodeNode, Value: p.Node},
			{Key: schema.NodeTimestamp, Value: s.nowMS()},
			{Key: schema.NodeQueues, Value: queues},
		}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Raw()
	if err != nil {
		return schema.Node{}, fmt.Errorf("heartbeat of node %s: %w", p.Node, err)
	}
	return schema.DecodeNode(raw)
}

// NodeGet returns one node's document.
func (s *Store) NodeGet(ctx context.Context, name string) (schema.Node, error) {
	raw, err := s.nodes.FindOne(ctx, bson.D{{Key: schema.NodeNode, Value: name}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Node{}, fmt.Errorf("node %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return schema.Node{}, fmt.Errorf("read node %q: %w", name, err)
	}
	return schema.DecodeNode(raw)
}
