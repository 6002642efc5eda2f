package perlconfig

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// A site's file, as 4.103 reads it: comments and trailing commas.
const siteFile = `{
    # where MongoDB is
    "mongohost": "db1.example.com:27017,db2.example.com:27017/?replicaSet=rs0",
    "database": "disbatch",   # the database
    "attributes": { "ssl": { "SSL_ca_file": "/etc/ssl/ca.pem", "SSL_verify_mode": 0, }, },
    "auth": { "disbatchd": "node-pw#1", "disbatch_web": "web pw", "task_runner": "tr", "queuebalance": "qb", "plugin": "pl" },
    "plugins": [ "Disbatch::Plugin::Demo", ],
    "activequeues": [], "ignorequeues": ["5a0000000000000000000001", "slow"],
    "gfs": "auto",
    "task_runner": "/usr/local/bin/task_runner",
    "web_root": "/srv/htdocs/",
    "monitoring": 1,
    "balance": { "enabled": 1, "log": 1 },
    "web_extensions": { "Disbatch::Web::Tasks": null },
    "log4perl": { "level": "DEBUG" },
    "quiet": 1,
    "colour": "blue",
}`

func TestParseASitesFile(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(siteFile), Node)
	require.NoError(t, err)
	u, err := url.Parse(c.MongoURI)
	require.NoError(t, err)
	require.Equal(t, "disbatchd", u.User.Username())
	pw, _ := u.User.Password()
	require.Equal(t, "node-pw#1", pw, "a # inside a string is not a comment")
	require.Equal(t, "db1.example.com:27017,db2.example.com:27017", u.Host)
	q := u.Query()
	require.Equal(t, "rs0", q.Get("replicaSet"))
	require.Equal(t, "disbatch", q.Get("authSource"), "4.103 authenticates on its database")
	require.Equal(t, "true", q.Get("tls"))
	require.Equal(t, "/etc/ssl/ca.pem", q.Get("tlsCAFile"))
	require.Equal(t, "true", q.Get("tlsInsecure"), "SSL_verify_mode 0")
	require.Equal(t, "disbatch", c.Database)
	require.Empty(t, c.ActiveQueues)
	require.Equal(t, []string{"5a0000000000000000000001", "slow"}, c.IgnoreQueues)
	require.Equal(t, GFSAuto, c.GFS)
	require.Equal(t, "/usr/local/bin/task_runner", c.TaskRunner)
	require.Equal(t, []string{"Disbatch::Plugin::Demo"}, c.Plugins)
	require.Equal(t, "/srv/htdocs/", c.WebRoot)
	require.True(t, c.Monitoring)
	require.Contains(t, c.Balance, "enabled")
	require.Contains(t, c.WebExtensions, "Disbatch::Web::Tasks")
	require.Equal(t, []string{"colour"}, c.Unknown, "unknown keys are reported, not fatal")
	require.Len(t, c.Unused, 2, "log4perl and quiet mean nothing here, and say why")

	w, err := Parse([]byte(siteFile), Web)
	require.NoError(t, err)
	u, err = url.Parse(w.MongoURI)
	require.NoError(t, err)
	require.Equal(t, "disbatch_web", u.User.Username(), "the web server connects as its own user")
}

func TestParseDefaultsAndModes(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`{"mongohost": "localhost", "database": "d"}`), Node)
	require.NoError(t, err)
	require.Equal(t, "mongodb://localhost/", c.MongoURI, "no auth, no TLS: as given")
	require.Equal(t, GFSAuto, c.GFS)
	require.Equal(t, "/usr/bin/task_runner", c.TaskRunner)
	require.Equal(t, "/etc/disbatch/htdocs/", c.WebRoot)
	require.False(t, c.Monitoring)
	for gfs, want := range map[string]GFS{`"auto"`: GFSAuto, `true`: GFSAlways, `1`: GFSAlways, `"yes"`: GFSAlways, `false`: GFSNever, `0`: GFSNever, `"0"`: GFSNever, `null`: GFSAuto,
		`0.0`: GFSNever, `0e0`: GFSNever, `0.5`: GFSAlways} {
		c, err := Parse([]byte(`{"mongohost": "mongodb://h/?replicaSet=r", "database": "d", "gfs": `+gfs+`}`), Node)
		require.NoError(t, err, gfs)
		require.Equal(t, want, c.GFS, gfs)
	}
	c, err = Parse([]byte(`{"mongohost": "h", "database": "d", "attributes": {"ssl": 1}}`), Node)
	require.NoError(t, err)
	require.Equal(t, "mongodb://h/?tls=true", c.MongoURI)
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for name, file := range map[string]string{
		"not JSON":           `{"mongohost": `,
		"no mongohost":       `{"database": "d"}`,
		"no database":        `{"mongohost": "h"}`,
		"no password":        `{"mongohost": "h", "database": "d", "auth": {"disbatch_web": "x"}}`,
		"queues not a list":  `{"mongohost": "h", "database": "d", "activequeues": "q"}`,
		"split cert and key": `{"mongohost": "h", "database": "d", "attributes": {"ssl": {"SSL_cert_file": "c.pem", "SSL_key_file": "k.pem"}}}`,
		"gfs neither":        `{"mongohost": "h", "database": "d", "gfs": [1]}`,
		"queues not strings": `{"mongohost": "h", "database": "d", "ignorequeues": [1]}`,
	} {
		_, err := Parse([]byte(file), Node)
		require.Error(t, err, name)
	}
}

func TestRelax(t *testing.T) {
	t.Parallel()
	require.Equal(t, `{"a": [1, 2], "b": "x # y, ]"}`, string(Relax([]byte(`{"a": [1, 2,], "b": "x # y, ]",}`))))
	require.Equal(t, "{ \n\"a\": 1 \n}", string(Relax([]byte("{ # c\n\"a\": 1, # d\n}"))))
}

// TestAttributesAsMongoDBConnectTakesThem: the attributes 4.103 hands
// MongoDB->connect become the connection's (credentials without an auth
// block, which replaces them as in 4.103; the replica set, timeouts);
// those these programs do not follow are reported with why, never
// dropped in silence (they were: a config with credentials in its
// attributes connected without them).
func TestAttributesAsMongoDBConnectTakesThem(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`{"mongohost": "h1,h2", "database": "d", "attributes": {
		"username": "u", "password": "p w", "db_name": "admin", "replica_set_name": "rs1",
		"connect_timeout_ms": 5000, "w": 1, "read_preference": "secondary", "frobnicate": true}}`), Node)
	require.NoError(t, err)
	require.Equal(t, "mongodb://u:p%20w@h1,h2/?authSource=admin&connectTimeoutMS=5000&replicaSet=rs1", c.MongoURI)
	require.Contains(t, c.Unused, "attributes.w: these programs write with the write concern each write needs (majority where a failover must not lose it)")
	require.Contains(t, c.Unused, "attributes.read_preference: these programs read from the primary")
	require.Contains(t, c.Unused, "attributes.frobnicate: no connection option here matches it (give it in a --mongo-uri instead)")

	// Values the connection string cannot take are reported, never a
	// start refused for them (a 4.103 site's socket_timeout_ms -1, Perl's
	// "no timeout"); mongohost's own options win.
	c, err = Parse([]byte(`{"mongohost": "mongodb://h/?replicaSet=rs0", "database": "d", "attributes": {
		"socket_timeout_ms": -1, "connect_timeout_ms": 10000.5, "server_selection_timeout_ms": null,
		"compressors": ["zlib", "zstd"], "replica_set_name": "other"}}`), Node)
	require.NoError(t, err)
	require.Equal(t, "mongodb://h/?compressors=zlib%2Czstd&replicaSet=rs0", c.MongoURI)
	require.Contains(t, c.Unused, "attributes.socket_timeout_ms: -1: not followed (a whole number of 0 or more here; a negative timeout, none in Perl's driver, is the default here)")
	require.Contains(t, c.Unused, "attributes.replica_set_name: mongohost's replicaSet is kept")
	require.Len(t, c.Unused, 4)

	c, err = Parse([]byte(`{"mongohost": "h", "database": "d", "auth": {"disbatchd": "secret"},
		"attributes": {"username": "u", "password": "p", "db_name": "admin"}}`), Node)
	require.NoError(t, err)
	require.Equal(t, "mongodb://disbatchd:secret@h/?authSource=d", c.MongoURI, "auth replaces the attributes' credentials")
}
