package dci_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestGoldenTaskControlFields: tasks carrying this project's task control
// fields, answered as the real 4.103 answered them side by side on the
// same database (2026-11-23): a BSON double keeps its ".0" (4.103's
// Cpanel::JSON::XS writes an NV so), and .epoch turns ctime and mtime into
// seconds but leaves every other date (not_before, an attempt's times) ISO.
func TestGoldenTaskControlFields(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	at := time.Date(2026, 11, 23, 5, 2, 20, 296e6, time.UTC)
	q := bson.NewObjectID()
	b.vars["q"] = q.Hex()
	_, err := b.db.Collection("tasks").InsertMany(context.Background(), []any{
		bson.D{{Key: "_id", Value: mustOID("6b03c8dced920dc64bfa797b")}, {Key: "queue", Value: q}, {Key: "ctime", Value: at}, {Key: "mtime", Value: at},
			{Key: "node", Value: -1}, {Key: "status", Value: -4}, {Key: "parameters", Value: bson.D{{Key: "k", Value: "delayed"}}},
			{Key: "stdout", Value: nil}, {Key: "stderr", Value: nil}, {Key: "not_before", Value: at.Add(time.Hour)}},
		bson.D{{Key: "_id", Value: mustOID("6b03c8dced920dc64bfa797c")}, {Key: "queue", Value: q}, {Key: "ctime", Value: at}, {Key: "mtime", Value: at},
			{Key: "node", Value: -1}, {Key: "status", Value: -2}, {Key: "parameters", Value: bson.D{{Key: "k", Value: "expiring"}}},
			{Key: "stdout", Value: nil}, {Key: "stderr", Value: nil}, {Key: "expires_at", Value: at.Add(time.Hour)}, {Key: "timeout", Value: 5.0}},
	})
	require.NoError(t, err)
	b.run([]exchange{
		{name: "epoch: ctime and mtime only", method: "GET", path: "/tasks?queue={{q}}&.limit=1&.epoch=1", status: 200,
			want: `{"_id":{"$oid":"6b03c8dced920dc64bfa797b"},"ctime":1795410140.296,"mtime":1795410140.296,"node":-1,"not_before":"2026-11-23T06:02:20","parameters":{"k":"delayed"},"queue":{"$oid":"{{q}}"},"status":-4,"stderr":null,"stdout":null}`},
		{name: "a double keeps .0", method: "GET", path: "/tasks/6b03c8dced920dc64bfa797c", status: 200,
			want: "{\n   \"_id\" : {\n      \"$oid\" : \"6b03c8dced920dc64bfa797c\"\n   },\n   \"ctime\" : \"2026-11-23T05:02:20\",\n   \"expires_at\" : \"2026-11-23T06:02:20\",\n   \"mtime\" : \"2026-11-23T05:02:20\",\n   \"node\" : -1,\n   \"parameters\" : {\n      \"k\" : \"expiring\"\n   },\n   \"queue\" : {\n      \"$oid\" : \"{{q}}\"\n   },\n   \"status\" : -2,\n   \"stderr\" : null,\n   \"stdout\" : null,\n   \"timeout\" : 5.0\n}\n"},
	})
}

func mustOID(s string) bson.ObjectID {
	id, err := bson.ObjectIDFromHex(s)
	if err != nil {
		panic(err)
	}
	return id
}
