package dci_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestMonitoringNodesAsFourOhThree: what the real 4.103 answered beside
// ours on one database. With no stale node there is no "stale" key; with
// no fresh one, "fresh" is {} (Perl made it when it looked). An age is the
// server's whole seconds minus the heartbeat's whole seconds, not the
// difference rounded down: a heartbeat at S.999 is 1 s old at S+1.1.
func TestMonitoringNodesAsFourOhThree(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()
	nodes := b.db.Collection("nodes")
	type answer struct {
		Disbatch struct {
			Status string                      `json:"status"`
			Nodes  map[string]map[string]int64 `json:"nodes"`
		} `json:"disbatch"`
	}
	get := func() (answer, string) {
		status, _, body := b.do("GET", "/monitoring", "", "")
		require.Equal(t, 200, status)
		var a answer
		require.NoError(t, json.Unmarshal([]byte(body), &a), body)
		return a, body
	}

	// A heartbeat at the last millisecond of a second, a moment ago.
	hb := time.Unix(time.Now().Unix()-1, 999_000_000)
	_, err := nodes.InsertOne(ctx, bson.D{{Key: "node", Value: "fresh"}, {Key: "timestamp", Value: bson.NewDateTimeFromTime(hb)}})
	require.NoError(t, err)
	before := time.Now().Unix()
	a, body := get()
	after := time.Now().Unix()
	require.Equal(t, "OK", a.Disbatch.Status)
	require.NotContains(t, a.Disbatch.Nodes, "stale", "no stale node, no stale key: %s", body)
	age := a.Disbatch.Nodes["fresh"]["fresh"]
	require.True(t, age == before-hb.Unix() || age == after-hb.Unix(), "age %d: whole seconds %d or %d minus %d", age, before, after, hb.Unix())

	_, err = nodes.DeleteMany(ctx, bson.D{})
	require.NoError(t, err)
	_, err = nodes.InsertOne(ctx, bson.D{{Key: "node", Value: "old"}, {Key: "timestamp", Value: bson.NewDateTimeFromTime(time.Now().Add(-time.Hour))}})
	require.NoError(t, err)
	a, body = get()
	require.Equal(t, "CRITICAL", a.Disbatch.Status)
	require.Contains(t, a.Disbatch.Nodes, "fresh", "fresh is there, empty: %s", body)
	require.Empty(t, a.Disbatch.Nodes["fresh"])
	require.Contains(t, a.Disbatch.Nodes["stale"], "old")
}
