package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/supervisor"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

func TestParseMaxThreads(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "1": 1, "12": 12, "100000": 100000} {
		n, err := parseMaxThreads(in)
		require.NoError(t, err, in)
		require.NotNil(t, n, in)
		require.Equal(t, want, *n, in)
	}
	for _, in := range []string{"null", "none"} {
		n, err := parseMaxThreads(in)
		require.NoError(t, err, in)
		require.Nil(t, n, in)
	}
	for _, in := range []string{"", "-1", "+3", "03", " 3", "3 ", "3x", "1.5", "1e3", "many", "NULL", "99999999999999999999"} {
		_, err := parseMaxThreads(in)
		require.Error(t, err, "%q", in)
	}
}

// flagsSet is a command with disbatchd's setting flags, after parsing args
// (only whether a flag was given matters to applyConfigFile).
func flagsSet(t *testing.T, args ...string) *cobra.Command {
	t.Helper()
	cmd := &cobra.Command{Use: "disbatchd"}
	f := cmd.Flags()
	for _, name := range []string{"mongo-uri", "database", "node", "maxthreads", "label", "log-format", "log-level"} {
		f.String(name, "", "")
	}
	f.StringSlice("enable-plugin", nil, "")
	for _, name := range []string{"plugin-timeout", "grace", "tick", "orphan-after"} {
		f.Duration(name, 0, "")
	}
	f.Bool("poll-only", false, "")
	f.Bool("no-projector", false, "")
	f.Int("output-threshold", 0, "")
	f.Int("supervisor-pool", 0, "")
	f.Bool("claim-running", true, "")
	f.Duration("claim-linger", 0, "")
	f.Int("claim-batch", claimer.DefaultBatch, "")
	f.Int("wakeup-listeners", 3, "")
	require.NoError(t, f.Parse(args))
	return cmd
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disbatchd.json")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

const fullConfig = `{
	"mongo_uri": "mongodb://file/", "database": "filedb", "node": "file-node", "maxthreads": 3,
	"label": "file-label", "enable_plugins": ["shell"], "plugins": {"X": "/file/x"},
	"plugin_timeout": "1m", "grace": "2s", "tick": "200ms", "orphan_after": "5m",
	"poll_only": true, "no_projector": true, "output_threshold": 1000, "log_format": "json", "log_level": "debug"
}`

// defaults are settings as run has them before the file is read.
func defaults() settings {
	return settings{
		MongoURI: "mongodb://default/", Database: "disbatch", Node: "host",
		Grace: duration(30 * time.Second), Tick: duration(time.Second), OrphanAfter: duration(time.Hour),
		OutputThreshold: 100, LogFormat: "text", LogLevel: "info", WakeupListeners: 3, ClaimBatch: claimer.DefaultBatch,
	}
}

func noEnv(string) string { return "" }

func TestApplyConfigFileFillsWhatIsUnset(t *testing.T) {
	s := defaults()
	var maxThreads string
	external := []string{}
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, fullConfig), &s, &maxThreads, &external, noEnv))
	require.Equal(t, settings{
		MongoURI: "mongodb://file/", Database: "filedb", Node: "file-node", Label: "file-label",
		EnablePlugins: []string{"shell"}, PluginTimeout: duration(time.Minute), Grace: duration(2 * time.Second),
		Tick: duration(200 * time.Millisecond), OrphanAfter: duration(5 * time.Minute), PollOnly: true, NoProjector: true,
		OutputThreshold: 1000, LogFormat: "json", LogLevel: "debug", WakeupListeners: 3, ClaimBatch: claimer.DefaultBatch,
	}, s)
	require.Equal(t, "3", maxThreads)
	require.Equal(t, []string{"X=/file/x"}, external)
}

// TestApplyConfigFileZeroDurations: a duration of "0s" in the file is a
// setting (no grace, no plugin timeout), not a key left out.
func TestApplyConfigFileZeroDurations(t *testing.T) {
	s := defaults()
	s.PluginTimeout = duration(time.Minute)
	var maxThreads string
	external := []string{}
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"grace": "0s", "plugin_timeout": "0s", "pre_images_idle": "0s"}`), &s, &maxThreads, &external, noEnv))
	require.Zero(t, s.Grace, "grace")
	require.Zero(t, s.PluginTimeout, "plugin_timeout")
	require.Zero(t, s.PreImagesIdle, "pre_images_idle")
	require.Equal(t, duration(time.Second), s.Tick, "a duration not in the file is left as it was")
	// A zero where zero is refused reaches checkSettings, which says so.
	s = defaults()
	s.Heartbeat, s.FenceAfter, s.DeadAfter = duration(time.Second), duration(time.Second), duration(time.Second)
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"tick": "0s"}`), &s, &maxThreads, &external, noEnv))
	require.ErrorContains(t, checkSettings(s), "--tick (config key tick) must be positive")
}

func TestApplyConfigFileFlagsAndEnvironmentWin(t *testing.T) {
	// As run has them after parsing these flags.
	cmd := flagsSet(t, "--node", "flag-node", "--maxthreads", "7", "--label", "flag-label", "--enable-plugin", "exec",
		"--plugin-timeout", "0s", "--grace", "0s", "--tick", "5s", "--orphan-after", "1h", "--poll-only=false",
		"--no-projector=false", "--output-threshold", "100", "--log-format", "text", "--log-level", "warn")
	s := defaults()
	s.Node, s.Label, s.EnablePlugins = "flag-node", "flag-label", []string{"exec"}
	s.Grace, s.Tick, s.LogLevel = 0, duration(5*time.Second), "warn"
	maxThreads := "7"
	external := []string{"X=/flag/x"}
	env := map[string]string{"DISBATCH_MONGO_URI": "mongodb://env/", "DISBATCH_DATABASE": "envdb"}
	s.MongoURI, s.Database = env["DISBATCH_MONGO_URI"], env["DISBATCH_DATABASE"]
	want := s

	require.NoError(t, applyConfigFile(cmd, writeConfig(t, fullConfig), &s, &maxThreads, &external, func(k string) string { return env[k] }))
	require.Equal(t, want, s)
	require.Equal(t, "7", maxThreads)
	// The file's plugins come first, so a --plugin for the same name wins.
	require.Equal(t, []string{"X=/file/x", "X=/flag/x"}, external)
}

func TestApplyConfigFileNodeFromEnvironment(t *testing.T) {
	s := defaults()
	s.Node = "env-node" // run's default for --node when DISBATCH_NODE is set
	var maxThreads string
	var external []string
	getenv := func(k string) string {
		if k == EnvNode {
			return "env-node"
		}
		return ""
	}
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"node": "file-node", "database": "filedb"}`), &s, &maxThreads, &external, getenv))
	require.Equal(t, "env-node", s.Node)
	require.Equal(t, "filedb", s.Database)
}

func TestApplyConfigFileErrors(t *testing.T) {
	for content, want := range map[string]string{
		`{"node": "x", "nodename": "y"}`:   `"nodename"`,
		`{"tick": "soon"}`:                 "soon",
		`{"tick": 5}`:                      "duration",
		`{"maxthreads": 1.5}`:              "maxthreads",
		`{"enable_plugins": "shell"}`:      "enable_plugins",
		`node = x`:                         "invalid character",
		`{"node": "a"} {"node": "b"}`:      "one JSON object",
		`{"node": "a"}}`:                   "one JSON object",
		`{"node": "a"`:                     "EOF",
		`["node", "a"]`:                    "cannot unmarshal array",
		`{"plugins": {"X": ["/a", "/b"]}}`: "plugins",
	} {
		s := defaults()
		var maxThreads string
		var external []string
		p := writeConfig(t, content)
		err := applyConfigFile(flagsSet(t), p, &s, &maxThreads, &external, noEnv)
		require.Error(t, err, "%s", content)
		require.Contains(t, err.Error(), want, "%s", content)
		require.Contains(t, err.Error(), p, "the error names the file")
	}
	s := defaults()
	var maxThreads string
	var external []string
	err := applyConfigFile(flagsSet(t), filepath.Join(t.TempDir(), "missing.json"), &s, &maxThreads, &external, noEnv)
	require.ErrorContains(t, err, "missing.json")
}

// run, to completion, for arguments that never reach MongoDB.
func runNoMongo(t *testing.T, args []string, vars map[string]string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, args, env{getenv: func(k string) string { return vars[k] }, stdout: &out, stderr: &errb, signals: make(chan os.Signal)})
	}()
	select {
	case code = <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("disbatchd %v did not return", args)
	}
	return code, out.String(), errb.String()
}

func TestRunUsageErrors(t *testing.T) {
	nowhere := []string{"--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=100"}
	for _, args := range [][]string{
		{"extra"},
		{"--maxthreads", "-1"},
		{"--log-format", "yaml"},
		{"--log-level", "loud"},
		{"--enable-plugin", "rm"},
		{"--grace", "-1s"},
		{"--plugin", "nameonly"},
		{"--node", ""},
		{"--config", writeConfig(t, `{"nodename": "x"}`)},
		{"--supervisor-pool", "two"},
		{"--supervisor-pool", "-1"},
		{"--claim-running=maybe"},
		{"--claim-linger", "-1ms"},
		{"--claim-linger", "1s"},
		{"--claim-linger", "soon"},
		{"--config", writeConfig(t, `{"claim_linger": "1s"}`)},
		{"--wakeup-listeners", "-1"},
		{"--wakeup-listeners", "few"},
		{"--config", writeConfig(t, `{"wakeup_listeners": -2}`)},
		{"--claim-batch", "0"},
		{"--claim-batch", "257"},
		{"--claim-batch", "many"},
		{"--config", writeConfig(t, `{"claim_batch": 0}`)},
		{"--config", writeConfig(t, `{"claim_batch": 1000}`)},
	} {
		code, _, stderr := runNoMongo(t, append(nowhere, args...), nil)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "Run 'disbatchd --help' for usage.", "%v", args)
	}
}

// TestHelp checks that --help documents every config file key (and a flag
// for each) and never shows the password of DISBATCH_MONGO_URI.
func TestHelp(t *testing.T) {
	code, stdout, stderr := runNoMongo(t, []string{"--help"}, map[string]string{
		"DISBATCH_MONGO_URI": "mongodb://admin:hunter2@db.example.com/?replicaSet=rs0",
	})
	require.Zero(t, code, stderr)
	require.NotContains(t, stdout+stderr, "hunter2")
	require.Contains(t, stdout, "mongodb://admin:xxxxx@db.example.com/")

	m := regexp.MustCompile(`\(JSON with\s+the keys ([^)]*)\)`).FindStringSubmatch(longHelp)
	require.NotNil(t, m, "the help lists the config file's keys")
	var documented []string
	for _, k := range strings.Split(m[1], ",") {
		documented = append(documented, strings.TrimSpace(k))
	}
	var keys []string
	st := reflect.TypeFor[settings]()
	for i := range st.NumField() {
		if k := strings.Split(st.Field(i).Tag.Get("json"), ",")[0]; k != "-" { // "-": not a --config key
			keys = append(keys, k)
		}
	}
	require.ElementsMatch(t, keys, documented, "config keys in --help vs the settings struct")

	flagFor := map[string]string{"enable_plugins": "enable-plugin", "plugins": "plugin", "no_supervise": "supervise"}
	for _, k := range keys {
		f := flagFor[k]
		if f == "" {
			f = strings.ReplaceAll(k, "_", "-")
		}
		require.Regexp(t, `(?m)^\s+--`+regexp.QuoteMeta(f)+`\b`, stdout, "config key %s has no flag --%s in --help", k, f)
	}
	require.Regexp(t, `(?m)^\s+--config\b`, stdout)
}

func TestSupervisorPool(t *testing.T) {
	base := settings{Node: "n", StateDir: t.TempDir()}
	l, err := supervisorLauncher(base, noEnv)
	require.NoError(t, err)
	require.Equal(t, supervisor.DefaultPool, l.Pool, "the default")
	zero := 0
	base.SupervisorPool = &zero
	l, err = supervisorLauncher(base, noEnv)
	require.NoError(t, err)
	require.Zero(t, l.Pool, "0: a fork per task")

	s := defaults()
	var maxThreads string
	var external []string
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"supervisor_pool": 5}`), &s, &maxThreads, &external, noEnv))
	require.Equal(t, 5, *s.SupervisorPool, "from the config file")
	s = defaults()
	three := 3
	s.SupervisorPool = &three
	require.NoError(t, applyConfigFile(flagsSet(t, "--supervisor-pool", "3"), writeConfig(t, `{"supervisor_pool": 5}`), &s, &maxThreads, &external, noEnv))
	require.Equal(t, 3, *s.SupervisorPool, "the flag wins")
}

func TestClaimRunningSetting(t *testing.T) {
	s := defaults()
	var maxThreads string
	var external []string
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"claim_running": false}`), &s, &maxThreads, &external, noEnv))
	require.NotNil(t, s.ClaimRunning)
	require.False(t, *s.ClaimRunning, "the file turns it off")
	s = defaults()
	on := true
	s.ClaimRunning = &on
	require.NoError(t, applyConfigFile(flagsSet(t, "--claim-running"), writeConfig(t, `{"claim_running": false}`), &s, &maxThreads, &external, noEnv))
	require.True(t, *s.ClaimRunning, "the flag wins")
}

func TestWakeupListenersSetting(t *testing.T) {
	code, stdout, _ := runNoMongo(t, []string{"--help"}, map[string]string{})
	require.Zero(t, code)
	require.Regexp(t, `--wakeup-listeners int\s+how many[^\n]*\(default 3\)`, stdout, "three unless told")
	testCountSetting(t, "wakeup-listeners", func(s *settings) *int { return &s.WakeupListeners }, 3,
		[]int{0, 5}, map[int]string{-1: "wakeup_listeners) must be 0 (every node) or more, got -1"})
}

// testCountSetting checks a count's flag and config key: not given, the
// default; the file's value where no flag gives one; valid and invalid
// values as checkSettings judges them, with the words of its refusal.
func testCountSetting(t *testing.T, flag string, field func(*settings) *int, def int, valid []int, invalid map[int]string) {
	t.Helper()
	key := strings.ReplaceAll(flag, "-", "_")
	var maxThreads string
	var external []string
	timing := func(s *settings) {
		s.Heartbeat, s.FenceAfter, s.DeadAfter = duration(time.Second), duration(10*time.Second), duration(30*time.Second)
	}
	s := defaults()
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"tick": "2s"}`), &s, &maxThreads, &external, noEnv))
	require.Equal(t, def, *field(&s), "not given: the default")
	for _, n := range valid {
		s := defaults()
		require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, fmt.Sprintf(`{%q: %d}`, key, n)), &s, &maxThreads, &external, noEnv))
		require.Equal(t, n, *field(&s), "the file's %d", n)
		timing(&s)
		require.NoError(t, checkSettings(s), "%d is valid", n)
	}
	s = defaults()
	*field(&s) = 2
	require.NoError(t, applyConfigFile(flagsSet(t, "--"+flag, "2"), writeConfig(t, fmt.Sprintf(`{%q: 5}`, key)), &s, &maxThreads, &external, noEnv))
	require.Equal(t, 2, *field(&s), "the flag wins")
	for n, words := range invalid {
		s := defaults()
		require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, fmt.Sprintf(`{%q: %d}`, key, n)), &s, &maxThreads, &external, noEnv))
		timing(&s)
		require.ErrorContains(t, checkSettings(s), words, "the file's %d is refused, not taken for the default", n)
	}
}

func TestClaimLingerSetting(t *testing.T) {
	var maxThreads string
	var external []string
	s := defaults()
	require.Nil(t, s.ClaimLinger)
	require.Equal(t, node.DefaultClaimLinger, claimLinger(s.ClaimLinger), "not given: the default")
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"claim_linger": "0s"}`), &s, &maxThreads, &external, noEnv))
	require.Equal(t, node.NoClaimLinger, claimLinger(s.ClaimLinger), "the file's 0 turns it off")
	s = defaults()
	require.NoError(t, applyConfigFile(flagsSet(t), writeConfig(t, `{"claim_linger": "7ms"}`), &s, &maxThreads, &external, noEnv))
	require.Equal(t, 7*time.Millisecond, claimLinger(s.ClaimLinger))
	s = defaults()
	two := duration(2 * time.Millisecond)
	s.ClaimLinger = &two
	require.NoError(t, applyConfigFile(flagsSet(t, "--claim-linger", "2ms"), writeConfig(t, `{"claim_linger": "7ms"}`), &s, &maxThreads, &external, noEnv))
	require.Equal(t, 2*time.Millisecond, claimLinger(s.ClaimLinger), "the flag wins")
	s.Heartbeat, s.FenceAfter, s.DeadAfter = duration(time.Second), duration(10*time.Second), duration(30*time.Second)
	require.NoError(t, checkSettings(s))
	neg := duration(-time.Millisecond)
	s.ClaimLinger = &neg
	require.ErrorContains(t, checkSettings(s), "claim_linger", "a file's negative linger")
	long := duration(time.Second)
	s.ClaimLinger = &long
	require.ErrorContains(t, checkSettings(s), "claim_linger", "a file's linger above the most")
}

func TestClaimBatchSetting(t *testing.T) {
	code, stdout, _ := runNoMongo(t, []string{"--help"}, map[string]string{})
	require.Zero(t, code)
	require.Regexp(t, `--claim-batch int\s+the most tasks one batched claim takes \(1 to 256\)[^\n]*\(default 48\)`, stdout, "48 unless told")
	testCountSetting(t, "claim-batch", func(s *settings) *int { return &s.ClaimBatch }, claimer.DefaultBatch,
		[]int{1, 16, 256}, map[int]string{0: "claim_batch) must be 1 to 256, got 0", -1: "got -1", 257: "claim_batch) must be 1 to 256, got 257"})
}
