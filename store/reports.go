package store

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// ReportInsert inserts one document into the collection reports, where
// Disbatch 4.103's Demo plugin writes a report per task (plugin.Demo).
func (s *Store) ReportInsert(ctx context.Context, doc bson.D) error {
	if _, err := s.db.Collection(schema.CollReports).InsertOne(ctx, doc); err != nil {
		return fmt.Errorf("insert a report: %w", err)
	}
	return nil
}
