package node

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/store"
)

// pagedClaims lists ids (sorted) as a store does: in _id order after
// After, at most Limit; it records what the sweep hands back.
type pagedClaims struct {
	ids       []bson.ObjectID
	unstarted []bson.ObjectID
}

func (s *pagedClaims) TaskListClaimed(_ context.Context, p store.TaskListClaimedParams) ([]bson.ObjectID, error) {
	if !p.Running {
		return nil, nil
	}
	var out []bson.ObjectID
	for _, id := range s.ids {
		if bytes.Compare(id[:], p.After[:]) > 0 && int64(len(out)) < p.Limit {
			out = append(out, id)
		}
	}
	return out, nil
}

func (s *pagedClaims) TaskRelease(context.Context, store.TaskTransitionParams) error { return nil }

func (s *pagedClaims) TaskUnstart(_ context.Context, p store.TaskTransitionParams) error {
	s.unstarted = append(s.unstarted, p.ID)
	return nil
}

// TestTheStraySweepPagesThroughWhatTheNodeHolds: a node holding more
// running tasks than one read lists still finds a stray claimed after
// them: each sweep goes on where the last one's read ended.
func TestTheStraySweepPagesThroughWhatTheNodeHolds(t *testing.T) {
	st := &pagedClaims{}
	for range 2*strayPage + 10 {
		st.ids = append(st.ids, bson.NewObjectID())
	}
	stray := st.ids[strayPage+500]
	held := func(id bson.ObjectID) bool { return id != stray }
	s := &strays{node: "n1", store: st, holds: held, claimRunning: true, fenced: func() bool { return false }, clock: clock.Or(nil), log: slog.New(slog.DiscardHandler)}
	s.release(context.Background())
	require.Empty(t, st.unstarted, "the first page holds no stray")
	s.release(context.Background())
	require.Equal(t, []bson.ObjectID{stray}, st.unstarted, "the stray beyond the first page")
	s.release(context.Background())
	s.release(context.Background()) // from the first again
	require.Len(t, st.unstarted, 1, "the stray once, the pages round again")
}
