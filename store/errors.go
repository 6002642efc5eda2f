package store

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
)

func asCommandError(err error, ce *mongo.CommandError) bool { return errors.As(err, ce) }

// isTooLarge reports whether MongoDB refused a write because the resulting
// document would exceed 16 MiB.
func isTooLarge(err error) bool {
	var ce mongo.CommandError
	if errors.As(err, &ce) && (ce.Code == 10334 || ce.Code == 17419 || ce.Code == 17420) {
		return true
	}
	var we mongo.WriteException
	if errors.As(err, &we) {
		for _, e := range we.WriteErrors {
			if e.Code == 10334 || e.Code == 17419 || e.Code == 17420 {
				return true
			}
		}
	}
	return errors.Is(err, driver.ErrDocumentTooLarge)
}
