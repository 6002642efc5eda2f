package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// ConfigGet returns the config document a node uses (see schema.Config):
// the one with the given label when label is set, otherwise the one marked
// active: true. It returns ErrNotFound when there is none, which is normal:
// the config collection is optional.
func (s *Store) ConfigGet(ctx context.Context, label string) (schema.Config, error) {
	filter, what := bson.D{{Key: schema.ConfigActive, Value: true}}, "marked active: true"
	if label != "" {
		filter, what = bson.D{{Key: schema.ConfigLabel, Value: label}}, "with label "+label
	}
	cur, err := s.config.Find(ctx, filter)
	if err != nil {
		return schema.Config{}, fmt.Errorf("read config: %w", err)
	}
	var docs []bson.Raw
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return schema.Config{}, fmt.Errorf("read config: %w", err)
	}
	switch len(docs) {
	case 0:
		return schema.Config{}, fmt.Errorf("config document %s: %w", what, ErrNotFound)
	case 1:
		return schema.DecodeConfig(docs[0])
	}
	return schema.Config{}, fmt.Errorf("read config: %d documents are %s; keep one (or give nodes distinct labels): %w", len(docs), what, ErrConfigAmbiguous)
}

// ErrConfigAmbiguous: more than one config document applies to a node.
var ErrConfigAmbiguous = errors.New("more than one config document applies")
