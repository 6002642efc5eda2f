package store

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// ConfigGet returns the config document a node uses (see schema.Config):
// the one with the given label when label is set; otherwise the one marked
// active: true, or the only document. It returns ErrNotFound when there is
// none, which is normal: the config collection is optional.
func (s *Store) ConfigGet(ctx context.Context, label string) (schema.Config, error) {
	filters := []bson.D{{{Key: schema.ConfigActive, Value: true}}, {}}
	if label != "" {
		filters = []bson.D{{{Key: schema.ConfigLabel, Value: label}}}
	}
	for i, f := range filters {
		cur, err := s.config.Find(ctx, f)
		if err != nil {
			return schema.Config{}, fmt.Errorf("read config: %w", err)
		}
		var docs []bson.Raw
		err = cur.All(ctx, &docs)
		if err != nil {
			return schema.Config{}, fmt.Errorf("read config: %w", err)
		}
		switch {
		case len(docs) == 1:
			return schema.DecodeConfig(docs[0])
		case len(docs) > 1 && i == 0 && label == "":
			return schema.Config{}, fmt.Errorf("read config: %d documents are marked active: true; mark one, or start the node with a label", len(docs))
		case len(docs) > 1:
			return schema.Config{}, fmt.Errorf("read config: %d documents match %v; give each a distinct label", len(docs), f)
		}
	}
	return schema.Config{}, fmt.Errorf("config: %w", ErrNotFound)
}
