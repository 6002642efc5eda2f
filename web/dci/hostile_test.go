package dci_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Hostile input on the 4.103 routes: each gets a 4xx saying what is wrong,
// nothing is written, and the server keeps serving.
func TestHostileInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	status, _, body := b.do("POST", "/queues", "json", `{"name":"q1","plugin":"Disbatch::Plugin::Demo"}`)
	require.Equal(t, 200, status, body)
	ctx := context.Background()
	count := func(coll string) int64 {
		n, err := b.db.Collection(coll).CountDocuments(ctx, bson.D{})
		require.NoError(t, err)
		return n
	}
	deep := strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100)
	for _, x := range []struct {
		name, method, path, ctype, body, want string
	}{
		{"deep params", "POST", "/tasks", "json", `{"queue":"q1","params":[` + deep + `]}`, `{"error":"'params' nested more than 64 deep"}`},
		{"deep legacy params", "POST", "/tasks/q1", "json", `[` + deep + `]`, `{"error":"'params' nested more than 64 deep"}`},
		{"NUL in a key", "POST", "/tasks", "json", `{"queue":"q1","params":[{"a\u0000b":1}]}`, `{"error":"'params' a key contains a NUL character"}`},
		{"invalid JSON", "POST", "/tasks", "json", `{"queue":`, `{"error":"invalid JSON body"}`},
		{"number too large", "POST", "/tasks", "json", `{"queue":"q1","params":[{"n":1e400}]}`, `{"error":"'params' number 1e400 is out of range"}`},
		{"queue name with spaces", "POST", "/queues", "json", `{"name":" q ","plugin":"Disbatch::Plugin::Demo"}`, ""},
		{"queue name an ObjectId", "POST", "/queues", "json", `{"name":"5c0000000000000000000000","plugin":"Disbatch::Plugin::Demo"}`, ""},
		{"threads too large", "POST", "/queues/q1", "json", `{"threads":99999999999999999999}`, `{"error":"threads must be a non-negative integer"}`},
		{"maxthreads an object", "POST", "/nodes/n", "json", `{"maxthreads":{"$gt":1}}`, `{"error":"maxthreads must be a non-negative integer or null"}`},
		{"server code in a GET /tasks filter", "GET", "/tasks", "json", `{"node":{"$not":{"$where":"sleep(1000)"}}}`,
			`{"error":"node: $where is not a query operator GET /tasks accepts (it accepts $all $eq $exists $gt $gte $in $lt $lte $mod $ne $nin $not $options $regex $size $type)"}`},
		{"operators nested too deep", "GET", "/tasks", "json", `{"node":` + strings.Repeat(`{"$not":`, 100) + `{"$eq":1}` + strings.Repeat(`}`, 100) + `}`, `{"error":"node nested more than 64 deep"}`},
		{"an operator's argument nested too deep", "GET", "/tasks", "json", `{"node":{"$type":[` + deep + `]}}`, `{"error":"nested more than 64 deep"}`},
		{"unicode collection", "POST", "/tasks", "json", `{"queue":"q1","collection":"ü$","filter":{},"params":{"a":"document.b"}}`, ""},
		{"balance not an object", "POST", "/balance", "json", `[1]`, ""},
		{"server code in a legacy search", "POST", "/tasks/search", "json", `{"filter":{"$or":[{"$where":"sleep(1000)"}]}}`, `{"error":"$where is not allowed: it runs code on the database server"}`},
		{"server code in a legacy search's projection", "POST", "/tasks/search", "json", `{"options":{"projection":{"x":{"$function":{"body":"function(){return 1}","args":[],"lang":"js"}}}}}`,
			`{"error":"$function is not allowed: it runs code on the database server"}`},
		{"server code in a legacy search's sort", "POST", "/tasks/search", "json", `{"options":{"sort":{"x":{"$meta":{"$accumulator":{}}}}}}`,
			`{"error":"$accumulator is not allowed: it runs code on the database server"}`},
		{"server code in GET /tasks .fields", "GET", "/tasks", "json", `{"node":"n",".fields":{"x":{"$function":{"body":"function(){return 1}","args":[],"lang":"js"}}}}`,
			`{"error":".fields: $function is not allowed: it runs code on the database server"}`},
		{"server code in a collection's filter", "POST", "/tasks", "json", `{"queue":"q1","collection":"tasks","filter":{"$expr":{"$function":{"body":"function(){return true}","args":[],"lang":"js"}}},"params":{"a":"document.queue"}}`,
			`{"error":"'filter': $function is not allowed: it runs code on the database server"}`},
		{"$where in a collection's filter", "POST", "/tasks", "json", `{"queue":"q1","collection":"tasks","filter":{"$where":"sleep(1000)"},"params":{"a":"document.queue"}}`,
			`{"error":"'filter': $where is not allowed: it runs code on the database server"}`},
	} {
		status, _, body := b.do(x.method, x.path, x.ctype, x.body)
		require.Equal(t, 400, status, "%s: %s", x.name, body)
		require.True(t, strings.HasPrefix(body, `{"`), "%s: a JSON object: %s", x.name, body)
		if x.want != "" {
			require.Equal(t, x.want, body, x.name)
		}
	}
	require.Zero(t, count("tasks"), "no task written")
	require.Equal(t, int64(1), count("queues"), "no queue written")
	require.Zero(t, count("balance"))
	status, _, _ = b.do("GET", "/queues", "", "")
	require.Equal(t, 200, status, "still serving")

	// A unicode name is a name like any other.
	status, _, body = b.do("POST", "/queues", "json", `{"name":"очередь-✓","plugin":"Disbatch::Plugin::Demo"}`)
	require.Equal(t, 200, status, body)
	status, _, body = b.do("GET", "/queues/очередь-✓", "", "")
	require.Equal(t, 200, status)
	require.Contains(t, body, `"name":"очередь-✓"`)
}

func TestConcurrentCreatesOfOneQueueName(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	bodies := make([]string, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _, bodies[i] = b.do("POST", "/queues", "form", "name=same&plugin=Disbatch%3A%3APlugin%3A%3ADemo")
		}()
	}
	wg.Wait()
	won := 0
	for i, s := range statuses {
		if s == 200 {
			won++
			continue
		}
		require.Equal(t, 400, s, bodies[i])
		require.Contains(t, bodies[i], `"MongoDB::DuplicateKeyError"`)
	}
	require.Equal(t, 1, won)
	n, err := b.db.Collection("queues").CountDocuments(context.Background(), bson.D{{Key: "name", Value: "same"}})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}
