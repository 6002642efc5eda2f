package integration

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

// TestLeastPrivilegeUsers: against a mongod with --auth, `disbatch users
// create` (as an admin) makes each program's role and user; the node, the
// web server and the CLI then each run with their own user and a task runs
// end to end; a write a role does not grant is refused.
func TestLeastPrivilegeUsers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key := make([]byte, 48)
	_, err := rand.Read(key)
	require.NoError(t, err)
	keyFile := filepath.Join(dir, "keyfile")
	require.NoError(t, os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := mongod.StartReplicaSet(ctx, mongod.Options{
		ExtraArgs: []string{"--auth", "--keyFile", keyFile},
		Root:      &options.Credential{Username: "admin", Password: "admin-pw"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rs.Stop() })
	const db = "lpdb"
	hostPart := strings.TrimPrefix(rs.URI(), "mongodb://")
	as := func(user, pw, authDB string) string {
		return "mongodb://" + user + ":" + pw + "@" + hostPart + "&authSource=" + authDB
	}
	admin := as("admin", "admin-pw", "admin")

	out := cli(t, admin, db, "disbatchd node-pw\ndisbatch_web web-pw\ndisbatch_cli cli-pw\nplugin plugin-pw\n", "users", "create")
	require.Contains(t, out, "user disbatchd (role disbatchd)")
	// Again: roles updated, passwords set, no error.
	cli(t, admin, db, "disbatchd node-pw\n", "users", "create")

	nodeURI, webURI, cliURI, pluginURI := as("disbatchd", "node-pw", db), as("disbatch_web", "web-pw", db), as("disbatch_cli", "cli-pw", db), as("plugin", "plugin-pw", db)
	cli(t, cliURI, db, "", "queue", "create", "q", "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "2")
	cli(t, cliURI, db, `{"commands":"a","counter":1}`+"\n"+`{"commands":"c"}`+"\n", "task", "submit", "q")
	node := startNode(t, nodeArgs(nodeURI, db, "lp-1"))
	require.Eventually(t, func() bool {
		r := runBin(t, disbatchBin, "", nil, "--mongo-uri", cliURI, "--database", db, "task", "list", "q")
		return strings.Count(r.stdout, "succeeded")+strings.Count(r.stdout, "failed") == 2
	}, 60*time.Second, 200*time.Millisecond, "the node ran the tasks with its own user: %s", node.log.String())
	require.NotContains(t, node.log.String(), "not authorized", "the node's role covers what it does")

	web := startWeb(t, []string{"--listen", "127.0.0.1:0", "--mongo-uri", webURI, "--database", db, "--log-format", "text"})
	web.waitLog("serving the Disbatch HTTP API", startWait)
	m := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)/`).FindStringSubmatch(web.log.String())
	require.NotNil(t, m)
	for _, path := range []string{"/api/v1/queues", "/api/v1/tasks?queue=q", "/api/v1/nodes", "/queues", "/api/v1/cluster"} {
		resp, err := http.Get(m[1] + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, "disbatch-web with its own user: GET %s", path)
	}
	resp, err := http.Post(m[1]+"/api/v1/tasks", "application/json", strings.NewReader(`{"queue":"q","tasks":[{"params":{"commands":"a"}}]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode, "disbatch-web submits")
	for _, line := range strings.Split(web.log.String(), "\n") {
		// Turning pre-images on is the nodes' (collMod on tasks): the web
		// server tries, and says it could not, by design.
		if !strings.Contains(line, "cannot turn on change-stream pre-images") {
			require.NotContains(t, line, "not authorized")
		}
	}

	// What a role does not grant is refused.
	refused := func(uri, what string, op func(*mongo.Database) error) {
		t.Helper()
		c, err := mongo.Connect(options.Client().ApplyURI(uri))
		require.NoError(t, err)
		defer func() { _ = c.Disconnect(context.Background()) }()
		err = op(c.Database(db))
		require.Error(t, err, what)
		require.Contains(t, err.Error(), "not authorized", what)
	}
	refused(pluginURI, "a plugin inserts a task", func(d *mongo.Database) error {
		_, err := d.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: "x"}})
		return err
	})
	refused(nodeURI, "the node deletes a queue", func(d *mongo.Database) error {
		_, err := d.Collection("queues").DeleteOne(ctx, bson.D{{Key: "name", Value: "q"}})
		return err
	})
	refused(webURI, "the web server writes a lease", func(d *mongo.Database) error {
		_, err := d.Collection("disbatch_leases").InsertOne(ctx, bson.D{{Key: "_id", Value: "leader"}})
		return err
	})
	refused(cliURI, "the CLI drops the database", func(d *mongo.Database) error { return d.Drop(ctx) })
	// The Demo's reports were written with the node's user.
	c, err := mongo.Connect(options.Client().ApplyURI(admin))
	require.NoError(t, err)
	defer func() { _ = c.Disconnect(context.Background()) }()
	n, err := c.Database(db).Collection("reports").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(2), "reports: "+strconv.FormatInt(n, 10)) // and the web's task's, once run
}
