package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestPriorRoundTripsAndAlwaysChanges(t *testing.T) {
	q := bson.NewObjectID()
	for _, p := range []Prior{{Queue: q, Status: StatusQueued}, {Queue: q, Status: StatusRunning, Node: "node one"}} {
		s := p.String()
		require.NotEqual(t, s, p.String(), "a fresh id each time, so the field always changes")
		got, err := ParsePrior(s)
		require.NoError(t, err)
		require.Equal(t, p, got)
	}
	for _, bad := range []string{"", "x -2 id", q.Hex() + " x id", q.Hex() + " -2"} {
		_, err := ParsePrior(bad)
		require.Error(t, err, bad)
	}
}
