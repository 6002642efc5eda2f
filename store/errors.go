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
	var bwe mongo.BulkWriteError // one write of a bulk write (guardedMany's)
	if errors.As(err, &bwe) && (bwe.Code == 10334 || bwe.Code == 17419 || bwe.Code == 17420) {
		return true
	}
	return errors.Is(err, driver.ErrDocumentTooLarge)
}

// ServerMessage returns the message MongoDB itself gave for err (a
// command or write error), without the store's wrapping, when there is one.
func ServerMessage(err error) (string, bool) {
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return "", false
	}
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return ce.Message, true
	}
	var we mongo.WriteException
	if errors.As(err, &we) && len(we.WriteErrors) > 0 {
		return we.WriteErrors[0].Message, true
	}
	return se.Error(), true
}
