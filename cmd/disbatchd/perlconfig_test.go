package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/store"
)

const perlFile = `{
	# a site's /etc/disbatch/config.json
	"mongohost": "db.example.com:27017/?replicaSet=rs0",
	"database": "sitedb",
	"auth": {"disbatchd": "pw", "disbatch_web": "w", "task_runner": "t", "queuebalance": "q", "plugin": "p"},
	"activequeues": ["5a0000000000000000000001", "reports",],
	"gfs": 1,
	"log4perl": {"level": "INFO"},
	"owner": "ops",
}`

func TestApplyPerlConfigFillsWhatIsUnset(t *testing.T) {
	s := defaults()
	notes, err := applyPerlConfig(flagsSet(t), writeConfig(t, perlFile), &s, defaults(), noEnv)
	require.NoError(t, err)
	require.Equal(t, "mongodb://disbatchd:pw@db.example.com:27017/?authSource=sitedb&replicaSet=rs0", s.MongoURI)
	require.Equal(t, "sitedb", s.Database)
	require.Equal(t, []string{"5a0000000000000000000001", "reports"}, s.ActiveQueues)
	require.Equal(t, store.OutputAlways, s.OutputThreshold, "gfs 1: every output in GridFS")
	require.Contains(t, notes, "unknown keys, not used (4.103 does not read them either): owner")
	require.Contains(t, notes, "not used: log4perl: logs are --log-format/--log-level (log/slog)")
	s.Heartbeat, s.FenceAfter, s.DeadAfter = duration(time.Second), duration(10*time.Second), duration(30*time.Second)
	require.NoError(t, checkSettings(s), "OutputAlways is a valid threshold")

	s = defaults()
	_, err = applyPerlConfig(flagsSet(t), writeConfig(t, `{"mongohost": "h", "database": "d", "gfs": false}`), &s, defaults(), noEnv)
	require.NoError(t, err)
	require.Equal(t, math.MaxInt32, s.OutputThreshold, "gfs false: inline")
}

func TestApplyPerlConfigFlagsEnvironmentAndConfigWin(t *testing.T) {
	// A flag, the environment, and --config (a value other than the default).
	cmd := flagsSet(t, "--output-threshold", "100")
	s := defaults()
	s.Database = "from-config"
	env := map[string]string{"DISBATCH_MONGO_URI": "mongodb://env/"}
	s.MongoURI = env["DISBATCH_MONGO_URI"]
	_, err := applyPerlConfig(cmd, writeConfig(t, perlFile), &s, defaults(), func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, "mongodb://env/", s.MongoURI)
	require.Equal(t, "from-config", s.Database)
	require.Equal(t, 100, s.OutputThreshold)
}

func TestApplyPerlConfigErrors(t *testing.T) {
	for _, file := range []string{`{"database": "d"}`, `{"mongohost": "h", "database": "d", "auth": {"plugin": "p"}}`, `not json`} {
		s := defaults()
		_, err := applyPerlConfig(flagsSet(t), writeConfig(t, file), &s, defaults(), noEnv)
		require.Error(t, err, file)
	}
	s := defaults()
	_, err := applyPerlConfig(flagsSet(t), "/nonexistent/config.json", &s, defaults(), noEnv)
	require.ErrorContains(t, err, "--perl-config")
}

func TestApplyPerlConfigQueueBalance(t *testing.T) {
	s := defaults()
	_, err := applyPerlConfig(flagsSet(t), writeConfig(t, `{"mongohost": "h", "database": "d", "balance": {"enabled": 1, "pretend": 1}}`), &s, defaults(), noEnv)
	require.NoError(t, err)
	require.True(t, s.QueueBalance, "balance.enabled: the leader applies the balance document")
	require.True(t, s.QueueBalancePretend)
	s = defaults()
	_, err = applyPerlConfig(flagsSet(t), writeConfig(t, `{"mongohost": "h", "database": "d", "balance": {"enabled": 0}}`), &s, defaults(), noEnv)
	require.NoError(t, err)
	require.False(t, s.QueueBalance)
}
