package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/perlconfig"
	"github.com/disbatch-go/disbatch/store"
)

// applyPerlConfig fills, from Disbatch 4.103's config file, the settings
// that no flag, environment variable or --config gave (defaults: the
// settings before --config). It returns notes to log: keys it does not use
// and why.
func applyPerlConfig(cmd *cobra.Command, path string, s *settings, defaults settings, getenv func(string) string) ([]string, error) {
	c, err := perlconfig.Load(path, perlconfig.Node)
	if err != nil {
		return nil, fmt.Errorf("--perl-config %s: %w", path, err)
	}
	unset := func(flag, envVar string) bool {
		return !cmd.Flags().Changed(flag) && (envVar == "" || getenv(envVar) == "")
	}
	if unset("mongo-uri", cmdline.EnvMongoURI) && s.MongoURI == defaults.MongoURI {
		s.MongoURI = c.MongoURI
	}
	if unset("database", cmdline.EnvDatabase) && s.Database == defaults.Database {
		s.Database = c.Database
	}
	s.ActiveQueues, s.IgnoreQueues = c.ActiveQueues, c.IgnoreQueues
	if unset("output-threshold", "") && s.OutputThreshold == defaults.OutputThreshold {
		switch c.GFS {
		case perlconfig.GFSAlways:
			s.OutputThreshold = store.OutputAlways
		case perlconfig.GFSNever:
			// Inline, unless the task document would pass MongoDB's
			// 16 MiB: then GridFS all the same, or the task could not
			// finish.
			s.OutputThreshold = math.MaxInt32
		}
	}
	if c.Balance != nil && unset("queue-balance", "") && perlTrue(c.Balance["enabled"]) {
		s.QueueBalance = true
		s.QueueBalancePretend = perlTrue(c.Balance["pretend"])
	}
	s.PerlConfigPath = path
	if s.TaskRunner == "" {
		s.TaskRunner = c.TaskRunner
	}
	switch c.GFS { // what 4.103's disbatchd passes task_runner
	case perlconfig.GFSAuto:
		s.TaskRunnerGFS = "auto"
	case perlconfig.GFSAlways:
		s.TaskRunnerGFS = "1"
	}
	var notes []string
	if len(c.Unknown) > 0 {
		notes = append(notes, "unknown keys, not used (4.103 does not read them either): "+strings.Join(c.Unknown, ", "))
	}
	for _, u := range c.Unused {
		notes = append(notes, "not used: "+u)
	}
	if len(c.Plugins) > 0 {
		notes = append(notes, "not used by the node: plugins (4.103's node ignores it too; disbatch-web reads it)")
	}
	if len(s.PerlPlugins) == 0 {
		notes = append(notes, "task_runner "+s.TaskRunner+" runs nothing: name the Perl plugins it should run with --perl-plugin")
	}
	return notes, nil
}

// perlTrue is Perl's truth of a value of the config file.
func perlTrue(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != "" && x != "0"
	case fmt.Stringer: // json.Number
		return x.String() != "0"
	}
	return true
}
