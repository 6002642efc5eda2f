package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// CollStreams holds change-stream resume tokens, one document per stream
// ({_id: name, token, saved}). It is this project's own collection; Disbatch
// 4 tools ignore it.
const CollStreams = "disbatch_streams"

// StreamTokenGet returns the saved resume token of the named stream, or
// ErrNotFound.
func (s *Store) StreamTokenGet(ctx context.Context, name string) (bson.Raw, error) {
	raw, err := s.db.Collection(CollStreams).FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("resume token of stream %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read resume token of stream %s: %w", name, err)
	}
	tok, ok := raw.Lookup("token").DocumentOK()
	if !ok {
		return nil, fmt.Errorf("resume token of stream %s: %w", name, ErrNotFound)
	}
	return tok, nil
}

// StreamTokenSave saves the resume token of the named stream.
func (s *Store) StreamTokenSave(ctx context.Context, name string, token bson.Raw) error {
	_, err := s.db.Collection(CollStreams).UpdateOne(ctx, bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "token", Value: token}, {Key: "saved", Value: s.nowMS()}}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("save resume token of stream %s: %w", name, err)
	}
	return nil
}

// StreamPositionLost reports whether a change stream cannot resume from the
// position it was given, so its reader must start afresh and re-read the
// database: the history is gone (ChangeStreamHistoryLost 286), the token is
// not in this deployment's history (ChangeStreamFatalError 280,
// InvalidResumeToken 260), or the token cannot even be read (40647, 50811,
// FailedToParse 9, as MongoDB 6.0 answers corrupt tokens).
func StreamPositionLost(err error) bool {
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return false
	}
	for _, code := range []int{286, 280, 260, 40647, 50811, 9} {
		if se.HasErrorCode(code) {
			return true
		}
	}
	return false
}
