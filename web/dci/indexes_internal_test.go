package dci

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/store"
)

// TestIndexListsInFourOhThreeOrder: the indexes a node of ours creates,
// listed in creation order, come out as the real 4.103 web API listed
// them on the same database (by index name).
func TestIndexListsInFourOhThreeOrder(t *testing.T) {
	created := []store.TaskIndex{
		{Name: "_id_", Keys: []string{"_id"}}, {Name: "node_1_status_1_queue_1__id_1", Keys: []string{"node", "status", "queue", "_id"}},
		{Name: "queue_1_status_1", Keys: []string{"queue", "status"}}, {Name: "status_1_mtime_1_queue_1", Keys: []string{"status", "mtime", "queue"}},
		{Name: "awaiting_parents_1_not_before_1", Keys: []string{"awaiting_parents", "not_before"}},
		{Name: "queue_1_priority_-1__id_1", Keys: []string{"queue", "priority", "_id"}}, {Name: "expires_at_1", Keys: []string{"expires_at"}},
		{Name: "parents_1", Keys: []string{"parents"}}, {Name: "queue_1_admitted_1", Keys: []string{"queue", "admitted"}}, {Name: "then_pending_1", Keys: []string{"then_pending"}},
	}
	got, err := json.Marshal(indexLists(created))
	require.NoError(t, err)
	require.Equal(t, `[["id"],["awaiting_parents","not_before"],["expires_at"],["node","status","queue","id"],["parents"],["queue","admitted"],`+
		`["queue","priority","id"],["queue","status"],["status","mtime","queue"],["then_pending"]]`, string(got))
}

// TestIndexListsReadTheNames: 4.103 reads an index's keys from its name,
// so an index an operator named lists its name, in its name's place (on
// the real 4.103 web API: {mtime: 1} named "aa_custom" lists
// ["aa_custom"], second). A name that is another's beginning is dropped.
func TestIndexListsReadTheNames(t *testing.T) {
	got, err := json.Marshal(indexLists([]store.TaskIndex{
		{Name: "queue_1_status_1", Keys: []string{"queue", "status"}}, {Name: "queue_1", Keys: []string{"queue"}},
		{Name: "aa_custom", Keys: []string{"mtime"}}, {Name: "_id_", Keys: []string{"_id"}},
		{Name: "two_keys", Keys: []string{"a", "b"}},
	}))
	require.NoError(t, err)
	require.Equal(t, `[["id"],["aa_custom"],["queue","status"],["a","b"]]`, string(got))
}
