package integration

// deployments/prometheus/alerts.yml: promtool checks the rules and runs
// their unit tests, and every series they select is one our programs
// export (checked against real scrapes: TestMetricsOfARealNode for
// disbatchd's, TestDeploymentsWebServes for
// disbatch-web's).

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// promtoolPath finds promtool (DISBATCH_PROMTOOL, else the PATH), or fails
// the test saying how to get it.
func promtoolPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("DISBATCH_PROMTOOL"); p != "" {
		return p
	}
	p, err := exec.LookPath("promtool")
	if errors.Is(err, exec.ErrNotFound) {
		t.Fatal("promtool is not on the PATH: install Debian's prometheus package (apt-get install prometheus; .ci/run does), " +
			"or set DISBATCH_PROMTOOL to a promtool binary")
	}
	require.NoError(t, err)
	return p
}

func TestDeploymentsAlertRules(t *testing.T) {
	t.Parallel()
	promtool := promtoolPath(t)
	dir := filepath.Join(deploymentsDir, "prometheus")
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"}, // loads alerts.yml too
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out.String())
		t.Logf("promtool %s: %s", strings.Join(args, " "), strings.TrimSpace(out.String()))
	}
	cfg := string(depReadFile(t, "prometheus/prometheus.yml"))
	require.Contains(t, cfg, "- alerts.yml", "prometheus.yml loads the rules")
}

// alertSelector is one series selector of an alert's expression:
// a metric name and its label matchers.
type alertSelector struct {
	alert, name string
	matchers    []alertMatcher
}

type alertMatcher struct{ label, op, value string }

var (
	selectorRE = regexp.MustCompile(`\b(disbatch_[a-z_]+)(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
)

// alertSelectors reads every disbatch_* selector of alerts.yml's rules.
func alertSelectors(t *testing.T) []alertSelector {
	t.Helper()
	var sels []alertSelector
	doc := depYAMLDocs(t, "prometheus/alerts.yml")[0]
	for _, g := range dig(doc, "groups").([]any) {
		for _, r := range digAnyList(g, "rules") {
			alert, expr := digString(r, "alert"), digString(r, "expr")
			require.NotEmpty(t, expr, "alert %s has an expression", alert)
			for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
				s := alertSelector{alert: alert, name: m[1]}
				for _, mm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
					s.matchers = append(s.matchers, alertMatcher{mm[1], mm[2], mm[3]})
				}
				sels = append(sels, s)
			}
		}
	}
	return sels
}

// requireAlertSeries: every selector of alerts.yml whose metric name
// passes ours names a family of s, with each label it matches on, and for
// an equality some sample with that value (but for alertOpenValues). want is how many selectors at
// least were checked (none would prove nothing).
func requireAlertSeries(t *testing.T, s scrape, ours func(name string) bool, want int) {
	t.Helper()
	checked := 0
	for _, sel := range alertSelectors(t) {
		if !ours(sel.name) {
			continue
		}
		checked++
		mf := s[sel.name]
		require.NotNil(t, mf, "alert %s selects %s, which /metrics does not have", sel.alert, sel.name)
		for _, m := range sel.matchers {
			hasLabel, hasValue := false, false
			for _, sample := range mf.GetMetric() {
				for _, l := range sample.GetLabel() {
					if l.GetName() == m.label {
						hasLabel = true
						hasValue = hasValue || l.GetValue() == m.value
					}
				}
			}
			require.True(t, hasLabel, "alert %s matches %s on label %q, which it does not have", sel.alert, sel.name, m.label)
			if m.op == "=" && !alertOpenValues[m.label] {
				require.True(t, hasValue, "alert %s matches %s{%s=%q}, a value /metrics does not show", sel.alert, sel.name, m.label, m.value)
			}
		}
	}
	require.GreaterOrEqual(t, checked, want, "selectors of alerts.yml checked against this scrape")
}

// alertOpenValues are labels whose values appear only once something
// happened (a reason once a task was given it): their name is checked,
// not the value.
var alertOpenValues = map[string]bool{"reason": true}

func isWebMetric(name string) bool  { return strings.HasPrefix(name, "disbatch_web_") }
func isNodeMetric(name string) bool { return !isWebMetric(name) }
