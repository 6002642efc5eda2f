package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestPlainAlikeAgreesWithTheEncoding: wherever plainAlike is sure, it
// says what comparing the encoded values says; it is sure for a batch of
// equal plain values and of unequal strings or integers of one type, and
// leaves times that differ in Go but not in BSON to the encoding.
func TestPlainAlikeAgreesWithTheEncoding(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cases := []struct {
		vals []any
		sure bool
	}{
		{[]any{int32(1), int32(1), int32(1)}, true},
		{[]any{int32(1), int32(2)}, true},
		{[]any{int32(1), int64(1)}, false},
		{[]any{"", "", ""}, true},
		{[]any{"a", "b"}, true},
		{[]any{nil, nil}, true},
		{[]any{nil, ""}, false},
		{[]any{true, false}, true},
		{[]any{now, now}, true},
		{[]any{now, now.Add(time.Microsecond)}, false},
		{[]any{now, now.UTC()}, false},
		{[]any{bson.NewDateTimeFromTime(now), bson.NewDateTimeFromTime(now)}, true},
		{[]any{1.5, 1.5}, false},
		{[]any{"a", bson.D{{Key: "x", Value: 1}}}, false},
		{[]any{bson.D{{Key: "x", Value: 1}}, bson.D{{Key: "x", Value: 1}}}, false},
	}
	for i, c := range cases {
		alike, sure := plainAlike(c.vals)
		require.Equal(t, c.sure, sure, "case %d %v", i, c.vals)
		if sure {
			require.Equal(t, encodedAlike(c.vals), alike, "case %d %v", i, c.vals)
		}
		require.Equal(t, encodedAlike(c.vals), (&pipedField{vals: c.vals}).alike(), "case %d %v", i, c.vals)
	}
}

// BenchmarkFinishAlike is the alike checks of a batch of 64 finishes that
// write the same status, output, mtime and reason: as built, and by
// encoding every value.
func BenchmarkFinishAlike(b *testing.B) {
	now := time.Now()
	fields := make([][]any, 5)
	for i, v := range []any{int32(1), "", "", now, nil} {
		fields[i] = make([]any, 64)
		for j := range fields[i] {
			fields[i][j] = v
		}
	}
	for _, c := range []struct {
		name  string
		alike func([]any) bool
	}{{"Plain", func(v []any) bool { return (&pipedField{vals: v}).alike() }}, {"Encoded", encodedAlike}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, f := range fields {
					_ = c.alike(f)
				}
			}
		})
	}
}
