package store

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// A reader far behind must not be sent 16 MiB replies: the server's batch
// is capped at the reader's MaxBatch.
func TestStreamOptionsCapTheServersBatch(t *testing.T) {
	for _, tc := range []struct {
		batch int
		want  int32
	}{{1000, 1000}, {7, 7}, {math.MaxInt32 + 10, math.MaxInt32}} {
		var got options.ChangeStreamOptions
		for _, set := range (streamShape{preImages: true}).options(time.Second, tc.batch).List() {
			require.NoError(t, set(&got))
		}
		require.NotNil(t, got.BatchSize, "batch %d", tc.batch)
		assert.Equal(t, tc.want, *got.BatchSize)
		require.NotNil(t, got.MaxAwaitTime)
		assert.Equal(t, time.Second, *got.MaxAwaitTime)
	}
}
