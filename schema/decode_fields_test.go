package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// TestReaderFieldsFindWhatLookupFinds: the reader's one pass over a
// document finds, for every name, the value Raw.LookupErr finds (the first
// of duplicate keys, nulls, nested documents and arrays whole, the empty
// key, more fields than the buffer holds), and nothing for absent names;
// bytes past the document's length are not read.
func TestReaderFieldsFindWhatLookupFinds(t *testing.T) {
	t.Parallel()
	d := bsoncore.NewDocumentBuilder().
		AppendObjectID("_id", bson.NewObjectID()).
		AppendString("status", "first").
		AppendInt32("status", 2). // a duplicate: the first counts
		AppendNull("node").
		AppendDocument("parameters", bsoncore.NewDocumentBuilder().AppendInt64("n", 7).AppendString("status", "inner").Build()).
		AppendArray("children", bsoncore.NewArrayBuilder().AppendInt32(1).AppendString("x").Build()).
		AppendString("", "empty key").
		AppendDouble("mtime", 1.5).
		AppendBoolean("a.b", true)
	for i := range 30 { // past the reader's buffer of 24
		d.AppendInt32("extra"+string(rune('a'+i%26))+string(rune('A'+i/26)), int32(i))
	}
	raw := bson.Raw(d.Build())
	r := newReader(CollTasks, raw)
	require.NoError(t, r.err)
	require.Len(t, r.fields, 39)
	elems, err := raw.Elements()
	require.NoError(t, err)
	names := []string{"absent", "a", "b", "parameters.n"}
	for _, e := range elems {
		names = append(names, e.Key())
	}
	// Bytes past the length, which Validate lets by: not fields.
	padded := append(append(bson.Raw(nil), raw...), 0x10, 'x', 0, 1, 0, 0, 0)
	require.NoError(t, padded.Validate())
	p := newReader(CollTasks, padded)
	require.NoError(t, p.err)
	require.Len(t, p.fields, 39)
	_, ok := p.field("x")
	require.False(t, ok)
	for _, name := range names {
		want, err := raw.LookupErr(name)
		got, ok := r.field(name)
		require.Equal(t, err == nil, ok, name)
		if ok {
			require.Equal(t, want.Type, got.Type, name)
			require.Equal(t, want.Value, got.Value, name)
		}
	}
	got, _ := r.field("status")
	require.Equal(t, "first", got.StringValue())
}
