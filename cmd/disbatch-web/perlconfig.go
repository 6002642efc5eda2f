package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/perlconfig"
	"github.com/disbatch-go/disbatch/web/dci"
)

// legacyExtension is the one 4.103 web extension served here (by
// --legacy-tasks-routes).
const legacyExtension = "Disbatch::Web::Tasks"

// applyPerlConfig fills, from Disbatch 4.103's config file, the settings no
// flag or environment variable gave, and returns notes to log.
func applyPerlConfig(cmd *cobra.Command, s *settings, getenv func(string) string) ([]string, error) {
	c, err := perlconfig.Load(s.perlConfig, perlconfig.Web)
	if err != nil {
		return nil, fmt.Errorf("--perl-config %s: %w", s.perlConfig, err)
	}
	unset := func(flag, envVar string) bool {
		return !cmd.Flags().Changed(flag) && (envVar == "" || getenv(envVar) == "")
	}
	if unset("mongo-uri", cmdline.EnvMongoURI) {
		s.mongoURI = c.MongoURI
	}
	if unset("database", cmdline.EnvDatabase) {
		s.database = c.Database
	}
	if unset("plugins", "") && len(c.Plugins) > 0 {
		s.plugins = c.Plugins
	}
	var notes []string
	if unset("web-root", "") {
		if st, err := os.Stat(c.WebRoot); err == nil && st.IsDir() {
			s.webRoot = c.WebRoot
		} else {
			notes = append(notes, "web_root "+c.WebRoot+" is not a folder here: 4.103's page at /index.html is this server's own")
		}
	}
	if unset("no-monitoring", "") {
		s.noMonitoring = !c.Monitoring // 4.103's default: off
	}
	if c.Balance != nil {
		s.balance = c.Balance
		if unset("balance-enabled", "") {
			s.balanceEnabled = perlconfig.Truthy(c.Balance["enabled"])
		}
	}
	var exts []string
	for name := range c.WebExtensions {
		if name == legacyExtension {
			if unset("legacy-tasks-routes", "") {
				s.legacyTasks = true
			}
			continue
		}
		exts = append(exts, name)
	}
	sort.Strings(exts)
	if len(exts) > 0 {
		notes = append(notes, "web_extensions not served (Perl modules; only "+legacyExtension+" has Go routes): "+strings.Join(exts, ", "))
	}
	if len(c.Unknown) > 0 {
		notes = append(notes, "unknown keys, not used (4.103 does not read them either): "+strings.Join(c.Unknown, ", "))
	}
	for _, u := range c.Unused {
		notes = append(notes, "not used: "+u)
	}
	return notes, nil
}

// balanceSettings are what GET /balance echoes as settings and /monitoring
// reads balance.enabled from.
func balanceSettings(s settings) map[string]any {
	if s.balance != nil {
		b := plainNumbers(s.balance).(map[string]any)
		b["enabled"] = 0
		if s.balanceEnabled {
			b["enabled"] = 1
		}
		return b
	}
	return dci.DefaultBalance(s.balanceEnabled)
}

// plainNumbers turns the config's json.Numbers into ints or float64s, as
// the 4.103 routes encode numbers.
func plainNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = plainNumbers(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = plainNumbers(e)
		}
		return l
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return int(n)
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
	}
	return v
}
