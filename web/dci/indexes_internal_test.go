package dci

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestIndexListsInFourOhThreeOrder: the indexes a node of ours creates,
// listed in creation order, come out as the real 4.103 web API listed
// them on the same database (by index name).
func TestIndexListsInFourOhThreeOrder(t *testing.T) {
	created := [][]string{{"_id"}, {"node", "status", "queue", "_id"}, {"queue", "status"}, {"status", "mtime", "queue"},
		{"awaiting_parents", "not_before"}, {"queue", "priority", "_id"}, {"expires_at"}, {"parents"}, {"queue", "admitted"}, {"then_pending"}}
	got, err := json.Marshal(indexLists(created))
	require.NoError(t, err)
	require.Equal(t, `[["id"],["awaiting_parents","not_before"],["expires_at"],["node","status","queue","id"],["parents"],["queue","admitted"],`+
		`["queue","priority","id"],["queue","status"],["status","mtime","queue"],["then_pending"]]`, string(got))
}
