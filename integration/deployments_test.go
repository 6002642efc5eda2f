package integration

// Static checks of deployments/ (no Docker, no cluster): the YAML parses,
// the compose file and the manifests say what deployments/README.md says,
// every disbatchd, disbatch and disbatch-web flag and DISBATCH_* variable
// used there exists, the JSON configs are accepted by the real binary, and
// so is the way each deployment runs disbatch-web (always with a
// credentials file, never --insecure). One test goes further and serves
// the API the way docker-compose.yml does, against the tests' MongoDB.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/disbatch-go/disbatch/internal/httpserver"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/metrics"
	"github.com/disbatch-go/disbatch/web/auth"
)

// deploymentsDir is deployments/ (tests run in integration/).
const deploymentsDir = "../deployments"

// depGrace is the grace all the deployments configure: the default.
const depGrace = 30 * time.Second

// depReadFile reads a file under deployments/.
func depReadFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deploymentsDir, filepath.FromSlash(rel)))
	require.NoError(t, err)
	return b
}

// depFiles lists every file under deployments/, relative to it, with '/'.
func depFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	require.NoError(t, filepath.WalkDir(deploymentsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(deploymentsDir, path)
		files = append(files, filepath.ToSlash(rel))
		return err
	}))
	require.NotEmpty(t, files)
	return files
}

// depYAMLDocs decodes every document of a YAML stream.
func depYAMLDocs(t *testing.T, rel string) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(depReadFile(t, rel)))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "%s document %d", rel, len(docs)+1)
		require.NotEmpty(t, doc, "%s document %d is empty", rel, len(docs)+1)
		docs = append(docs, doc)
	}
	require.NotEmpty(t, docs, "%s has no YAML document", rel)
	return docs
}

// Helpers to walk decoded YAML/JSON: dig(m, "a", "b") is m["a"]["b"].
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func digMap(v any, keys ...string) map[string]any {
	m, _ := dig(v, keys...).(map[string]any)
	return m
}

func digString(v any, keys ...string) string {
	s, _ := dig(v, keys...).(string)
	return s
}

// digStrings is a YAML list (or a single string, split on blanks) as strings.
func digStrings(v any, keys ...string) []string {
	switch x := dig(v, keys...).(type) {
	case string:
		return strings.Fields(x)
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, fmt.Sprint(e))
		}
		return out
	}
	return nil
}

// helpFlags runs bin with args (ending in --help) and returns the long
// flags its help lists, and the help.
func helpFlags(t *testing.T, bin string, args ...string) (map[string]bool, string) {
	t.Helper()
	r := runBin(t, bin, "", nil, args...)
	require.Zero(t, r.code, "%s %v: %s", filepath.Base(bin), args, r.stderr)
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-zA-Z0-9][a-zA-Z0-9-]*)`).FindAllStringSubmatch(r.stdout, -1) {
		flags[m[1]] = true
	}
	require.NotEmpty(t, flags, "%s %v lists no flags", filepath.Base(bin), args)
	return flags, r.stdout
}

// flagName is the name of a --flag or --flag=value token, or "" (quotes,
// brackets and trailing punctuation around it are not part of it).
func flagName(tok string) string {
	m := flagTokRE.FindStringSubmatch(strings.TrimLeft(tok, "`'\",[]("))
	if m == nil {
		return ""
	}
	return m[1]
}

var flagTokRE = regexp.MustCompile(`^--([a-zA-Z0-9][a-zA-Z0-9_-]*)`)

// helpTree answers, for a binary with subcommands, the flags and the
// subcommands of each command path ("queue create"), from its --help; all
// collects every flag seen.
type helpTree struct {
	t    *testing.T
	bin  string
	cmds map[string]helpCmd
	all  map[string]bool
}

type helpCmd struct{ flags, subs map[string]bool }

func newHelpTree(t *testing.T, bin string) *helpTree {
	h := &helpTree{t: t, bin: bin, cmds: map[string]helpCmd{}, all: map[string]bool{}}
	h.of(nil)
	return h
}

func (h *helpTree) of(path []string) helpCmd {
	h.t.Helper()
	key := strings.Join(path, " ")
	if c, ok := h.cmds[key]; ok {
		return c
	}
	f, help := helpFlags(h.t, h.bin, append(slices.Clone(path), "--help")...)
	c := helpCmd{flags: f, subs: map[string]bool{}}
	if _, list, ok := strings.Cut(help, "Available Commands:\n"); ok {
		list, _, _ = strings.Cut(list, "\n\n")
		for _, l := range strings.Split(list, "\n") {
			if fs := strings.Fields(l); len(fs) > 0 {
				c.subs[fs[0]] = true
			}
		}
	}
	h.cmds[key] = c
	for name := range f {
		h.all[name] = true
	}
	return c
}

// command resolves the subcommand path at the start of args.
func (h *helpTree) command(args []string) ([]string, helpCmd) {
	var path []string
	for _, arg := range args {
		if !h.of(path).subs[arg] {
			break
		}
		path = append(path, arg)
	}
	return path, h.of(path)
}

// otherToolFlags are the flags of other programs used in deployments/
// (mongod, mongosh, docker, kubectl, useradd, systemctl, go); any other
// --flag there must be one of disbatchd or of the disbatch CLI.
var otherToolFlags = map[string]string{
	"replSet": "mongod", "bind_ip_all": "mongod", "wiredTigerCacheSizeGB": "mongod",
	"quiet": "mongosh", "host": "mongosh", "eval": "mongosh",
	"build": "docker compose up", "build-arg": "docker build", "from": "Dockerfile COPY",
	"from-literal": "kubectl create secret", "from-file": "kubectl create secret",
	"system": "useradd", "no-create-home": "useradd",
	"shell": "useradd", "now": "systemctl", "man": "systemd-analyze", "time": "docker stop",
	"rm": "docker run", "entrypoint": "docker run",
	"username": "Disbatch 4.103's CLI", "password": "Disbatch 4.103's CLI",
}

func TestDeploymentsYAMLParses(t *testing.T) {
	t.Parallel()
	n := 0
	for _, f := range depFiles(t) {
		if strings.HasSuffix(f, ".yml") || strings.HasSuffix(f, ".yaml") {
			depYAMLDocs(t, f)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 4, "docker-compose.yml, prometheus.yml and the Kubernetes manifests")
	var k8sDocs int
	for _, f := range depFiles(t) {
		if strings.HasPrefix(f, "kubernetes/") && strings.HasSuffix(f, ".yaml") && !strings.HasSuffix(f, "kustomization.yaml") {
			k8sDocs += len(depYAMLDocs(t, f))
		}
	}
	require.GreaterOrEqual(t, k8sDocs, 2, "the Kubernetes manifests hold a Deployment and a ConfigMap at least")
}

// TestDeploymentsUseOnlyRealFlagsAndVariables: every --flag given to
// disbatchd, to the disbatch CLI or to disbatch-web in deployments/ is in
// its --help, any other --flag is a known other tool's, and every
// DISBATCH_* variable is in disbatchd's or disbatch-web's --help or in the
// code.
func TestDeploymentsUseOnlyRealFlagsAndVariables(t *testing.T) {
	t.Parallel()
	nodeFlags, nodeHelp := helpFlags(t, disbatchdBin, "--help")
	require.True(t, nodeFlags["metrics-addr"], "disbatchd has --metrics-addr")
	cli := newHelpTree(t, disbatchBin)
	webBin := depBinary(t, "./cmd/disbatch-web")
	web := newHelpTree(t, webBin)
	_, webHelp := helpFlags(t, webBin, "--help")
	for _, f := range []string{"listen", "users", "insecure", "tls-cert", "tls-key", "mongo-uri", "database"} {
		require.True(t, web.all[f], "disbatch-web has --%s", f)
	}
	for _, sub := range []string{"passwd", "token"} {
		require.True(t, web.of(nil).subs[sub], "disbatch-web has the subcommand %s", sub)
	}

	isCmd := func(tok, name string) bool {
		tok = strings.Trim(tok, "`'\",[]()")
		return tok == name || strings.HasSuffix(tok, "bin/"+name) // not /etc/disbatch
	}
	isSep := func(tok string) bool { return slices.Contains([]string{"|", "||", "&&", ";", "#"}, tok) }
	used := 0

	// Command lines in any file: the flags after `disbatchd` or `disbatch`.
	for _, f := range depFiles(t) {
		for i, line := range strings.Split(string(depReadFile(t, f)), "\n") {
			toks := strings.Fields(line)
			for j, tok := range toks {
				switch {
				case isCmd(tok, "disbatchd"):
					for _, arg := range toks[j+1:] {
						if isSep(arg) {
							break
						}
						if name := flagName(arg); name != "" {
							require.True(t, nodeFlags[name], "%s:%d: disbatchd has no flag --%s", f, i+1, name)
							used++
						}
					}
				case isCmd(tok, "disbatch"), isCmd(tok, "disbatch-web"):
					tree, bin := cli, "disbatch"
					if isCmd(tok, "disbatch-web") {
						tree, bin = web, "disbatch-web"
					}
					// Subcommands as written in a YAML or JSON list too:
					// "node", "drain",
					words := make([]string, 0, len(toks)-j-1)
					for _, w := range toks[j+1:] {
						words = append(words, strings.Trim(w, "`'\",[]()"))
					}
					path, c := tree.command(words)
					for _, arg := range toks[j+1:] {
						if isSep(arg) {
							break
						}
						if name := flagName(arg); name != "" {
							require.True(t, c.flags[name], "%s:%d: %s %s has no flag --%s", f, i+1, bin, strings.Join(path, " "), name)
						}
					}
				}
			}
		}
	}

	// Arguments given to disbatchd in YAML: the compose nodes' commands and
	// the Kubernetes container's command and args.
	compose := depYAMLDocs(t, "docker-compose.yml")[0]
	var yamlArgs []string
	for name, svc := range digMap(compose, "services") {
		if strings.HasPrefix(name, "disbatchd") {
			yamlArgs = append(yamlArgs, digStrings(svc, "command")...)
			yamlArgs = append(yamlArgs, digStrings(svc, "entrypoint")...)
		}
	}
	for _, c := range k8sContainers(t) {
		if dig(c, "name") == "disbatchd" {
			yamlArgs = append(yamlArgs, digStrings(c, "command")...)
			yamlArgs = append(yamlArgs, digStrings(c, "args")...)
		}
	}
	for _, arg := range yamlArgs {
		if name := flagName(arg); name != "" {
			require.True(t, nodeFlags[name], "disbatchd has no flag --%s (in the YAML)", name)
			used++
		}
	}
	require.GreaterOrEqual(t, used, 3, "the deployments pass flags to disbatchd")

	// Arguments given to disbatch-web in YAML: the compose service's and the
	// Kubernetes container's.
	webArgs := 0
	for _, l := range webLaunches(t) {
		for _, arg := range l.args {
			if name := flagName(arg); name != "" {
				require.True(t, web.all[name], "%s: disbatch-web has no flag --%s", l.where, name)
				webArgs++
			}
		}
	}
	require.GreaterOrEqual(t, webArgs, 3, "the deployments pass flags to disbatch-web")

	// Anywhere: every --flag belongs to disbatchd, the CLI, disbatch-web or
	// a known tool.
	flagRE := regexp.MustCompile(`(?:^|[\s"'\[,(` + "`" + `])--([a-zA-Z][a-zA-Z0-9_-]*)`)
	for _, f := range depFiles(t) {
		for i, line := range strings.Split(string(depReadFile(t, f)), "\n") {
			for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				if nodeFlags[name] || cli.all[name] || web.all[name] || otherToolFlags[name] != "" {
					continue
				}
				t.Errorf("%s:%d: --%s is not a flag of disbatchd, of disbatch, of disbatch-web, or of a tool in otherToolFlags", f, i+1, name)
			}
		}
	}

	// DISBATCH_* variables: documented in --help, or at least in the code.
	envRE := regexp.MustCompile(`\bDISBATCH_[A-Z0-9_]+\b`)
	seen := map[string]bool{}
	for _, f := range depFiles(t) {
		for _, v := range envRE.FindAllString(string(depReadFile(t, f)), -1) {
			seen[v] = true
		}
	}
	for _, v := range []string{"DISBATCH_MONGO_URI", "DISBATCH_NODE", "DISBATCH_METRICS_ADDR", "DISBATCH_WEB_LISTEN", "DISBATCH_WEB_USERS"} {
		require.True(t, seen[v], "deployments/ uses %s", v)
	}
	for v := range seen {
		if strings.Contains(nodeHelp, v) || strings.Contains(webHelp, v) {
			continue
		}
		require.True(t, inGoCode(t, `"`+v+`"`), "%s is used in deployments/ but is neither in disbatchd's or disbatch-web's --help nor in the code", v)
	}
}

// inGoCode reports whether s occurs in a non-test Go file of the module.
func inGoCode(t *testing.T, s string) bool {
	t.Helper()
	found := false
	require.NoError(t, filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || found {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		found = err == nil && bytes.Contains(b, []byte(s))
		return err
	}))
	return found
}

func TestDeploymentsCompose(t *testing.T) {
	t.Parallel()
	compose := depYAMLDocs(t, "docker-compose.yml")[0]
	services := digMap(compose, "services")
	for _, name := range []string{"mongo1", "mongo2", "mongo3", "mongo-init", "disbatchd-1", "disbatchd-2", "jaeger", "prometheus"} {
		require.Contains(t, services, name, "docker-compose.yml has service %s", name)
	}

	// The replica set: three mongo:6.0 members and an init step.
	for _, name := range []string{"mongo1", "mongo2", "mongo3"} {
		svc := services[name]
		require.Equal(t, "mongo:6.0", digString(svc, "image"), name)
		cmd := strings.Join(digStrings(svc, "command"), " ")
		require.Contains(t, cmd, "--replSet rs0", name)
		require.NotNil(t, dig(svc, "healthcheck"), "%s has a healthcheck (mongo-init waits for it)", name)
	}
	initCmd := strings.Join(digStrings(services["mongo-init"], "command"), " ")
	require.Contains(t, initCmd, "rs.initiate(")
	for _, host := range []string{"mongo1:27017", "mongo2:27017", "mongo3:27017"} {
		require.Contains(t, initCmd, host)
	}
	for _, name := range []string{"mongo1", "mongo2", "mongo3"} {
		require.Equal(t, "service_healthy", digString(services["mongo-init"], "depends_on", name, "condition"))
	}

	// The nodes.
	promPort := ""
	names := map[string]bool{}
	for _, name := range []string{"disbatchd-1", "disbatchd-2"} {
		svc := services[name]
		ctx := digString(svc, "build", "context")
		df := digString(svc, "build", "dockerfile")
		require.NotEmpty(t, ctx, "%s is built from the repository", name)
		require.FileExists(t, filepath.Join(deploymentsDir, ctx, df), "%s's Dockerfile", name)
		require.FileExists(t, filepath.Join(deploymentsDir, ctx, "go.mod"), "%s's build context is the module root", name)
		require.Equal(t, "service_completed_successfully", digString(svc, "depends_on", "mongo-init", "condition"), name)

		env := digMap(svc, "environment")
		require.Contains(t, digString(env, "DISBATCH_MONGO_URI"), "replicaSet=rs0", name)
		for _, host := range []string{"mongo1:27017", "mongo2:27017", "mongo3:27017"} {
			require.Contains(t, digString(env, "DISBATCH_MONGO_URI"), host, name)
		}
		node := digString(env, "DISBATCH_NODE")
		require.NotEmpty(t, node, "%s has a node name", name)
		require.False(t, names[node], "node name %s is used twice", node)
		names[node] = true
		require.Equal(t, "http://jaeger:4318", digString(env, "OTEL_EXPORTER_OTLP_ENDPOINT"), name)
		require.Equal(t, "otlp", digString(env, "OTEL_TRACES_EXPORTER"), name)
		require.Equal(t, "disbatchd", digString(env, "OTEL_SERVICE_NAME"), name)

		addr, err := metrics.ListenAddr(digString(env, "DISBATCH_METRICS_ADDR"))
		require.NoError(t, err, name)
		host, port, err := net.SplitHostPort(addr)
		require.NoError(t, err, name)
		require.Equal(t, "0.0.0.0", host, "%s: the metrics must be reachable from the prometheus container", name)
		promPort = port

		stop, err := time.ParseDuration(digString(svc, "stop_grace_period"))
		require.NoError(t, err, "%s: stop_grace_period", name)
		require.Greater(t, stop, composeGrace(t, svc), "%s: stop_grace_period must exceed --grace", name)
	}

	require.True(t, strings.HasPrefix(digString(services["jaeger"], "image"), "jaegertracing/jaeger:2."), "Jaeger v2 all-in-one")

	// Prometheus scrapes both nodes.
	var promFile string
	for _, v := range digStrings(services["prometheus"], "volumes") {
		src, dst, _ := strings.Cut(v, ":")
		if strings.HasPrefix(dst, "/etc/prometheus/prometheus.yml") {
			promFile = src
		}
	}
	require.NotEmpty(t, promFile, "prometheus mounts a prometheus.yml")
	prom := depYAMLDocs(t, filepath.ToSlash(filepath.Clean(promFile)))[0]
	var targets []string
	for _, sc := range dig(prom, "scrape_configs").([]any) {
		for _, st := range digAnyList(sc, "static_configs") {
			targets = append(targets, digStrings(st, "targets")...)
		}
	}
	for _, name := range []string{"disbatchd-1", "disbatchd-2"} {
		require.Contains(t, targets, name+":"+promPort, "prometheus.yml scrapes %s", name)
	}

	// Every published port is on the host's loopback only.
	for name, svc := range services {
		for _, p := range digStrings(svc, "ports") {
			require.True(t, strings.HasPrefix(p, "127.0.0.1:"), "%s publishes %s beyond 127.0.0.1", name, p)
		}
	}

	// disbatch-web: the nodes' image and database, on every interface of
	// its container, with a credentials file, published on the host's
	// loopback, probed on /healthz, scraped by Prometheus.
	web := services["web"]
	require.NotNil(t, web, "docker-compose.yml has service web")
	require.Equal(t, digMap(services["disbatchd-1"], "build"), digMap(web, "build"), "web is built as the nodes are (the same image)")
	require.Equal(t, "service_completed_successfully", digString(web, "depends_on", "mongo-init", "condition"), "web")
	for _, v := range []string{"DISBATCH_MONGO_URI", "DISBATCH_DATABASE"} {
		require.NotEmpty(t, digString(web, "environment", v), "web sets %s", v)
		require.Equal(t, digString(services["disbatchd-1"], "environment", v), digString(web, "environment", v), "web's %s is the nodes'", v)
	}
	l := composeWebLaunch(t, "web", web)
	require.Equal(t, "/usr/local/bin/disbatch-web", l.program, "web runs the image's disbatch-web")
	host, port, users := checkWebLaunch(t, l)
	require.Equal(t, "0.0.0.0", host, "web must be reachable through its published port and by prometheus")
	require.Contains(t, digStrings(web, "ports"), "127.0.0.1:8080:"+port, "web is published on 127.0.0.1:8080 (deployments/README.md)")

	// The credentials file is a read-only bind mount of a file that exists
	// (by default) and that the server accepts; a missing one is an error.
	var usersSource string
	for _, v := range digAnyList(web, "volumes") {
		var src, dst string
		readOnly := false
		switch v := v.(type) {
		case string:
			parts := strings.Split(v, ":")
			require.GreaterOrEqual(t, len(parts), 2, "web volume %q", v)
			src, dst = parts[0], parts[1]
			readOnly = len(parts) > 2 && slices.Contains(strings.Split(parts[2], ","), "ro")
		case map[string]any:
			src, dst = digString(v, "source"), digString(v, "target")
			readOnly = dig(v, "read_only") == true
			if dst == users {
				require.Equal(t, "bind", digString(v, "type"), "web's credentials file is a bind mount")
				require.Equal(t, false, dig(v, "bind", "create_host_path"), "a missing credentials file must not become an empty directory")
			}
		}
		if dst == users {
			require.True(t, readOnly, "web mounts its credentials file read-only")
			usersSource = composeDefault(src)
		}
	}
	require.NotEmpty(t, usersSource, "web mounts its credentials file (%s)", users)
	usersFile := filepath.Join(deploymentsDir, filepath.FromSlash(usersSource))
	require.FileExists(t, usersFile, "web's default credentials file")
	_, err := auth.LoadFile(usersFile)
	require.NoError(t, err, "web's default credentials file")

	// Its health check: the image's healthcheck on /healthz of its port.
	hc := digStrings(web, "healthcheck", "test")
	require.Equal(t, []string{"CMD", "/usr/local/bin/healthcheck", "http://127.0.0.1:" + port + "/healthz"}, hc, "web's healthcheck")
	require.NotEmpty(t, digString(web, "healthcheck", "start_period"), "web connects to MongoDB before it listens: a start_period")

	require.Contains(t, targets, "web:"+port, "prometheus.yml scrapes web's /metrics")
	require.Contains(t, digStrings(services["prometheus"], "depends_on"), "web")

	webAccepts(t, l, usersFile)
}

// composeDefault is a compose value with ${VAR:-default} and ${VAR-default}
// replaced by their defaults, and ${VAR} by "" (the tests' environment is
// not the operator's).
func composeDefault(v string) string {
	return regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}`).ReplaceAllString(v, "$1")
}

func digAnyList(v any, keys ...string) []any {
	l, _ := dig(v, keys...).([]any)
	return l
}

// composeGrace is the --grace a compose service gives, or the default.
func composeGrace(t *testing.T, svc any) time.Duration {
	t.Helper()
	return graceIn(t, digStrings(svc, "command"), depGrace)
}

// graceIn is the value of --grace in args, or def.
func graceIn(t *testing.T, args []string, def time.Duration) time.Duration {
	t.Helper()
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--grace=")
		if a == "--grace" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			d, err := time.ParseDuration(v)
			require.NoError(t, err, "--grace %s", v)
			return d
		}
	}
	return def
}

// k8sDocs are the documents of every Kubernetes manifest.
func k8sDocs(t *testing.T) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for _, f := range depFiles(t) {
		if strings.HasPrefix(f, "kubernetes/") && (strings.HasSuffix(f, ".yaml") || strings.HasSuffix(f, ".yml")) &&
			!strings.HasSuffix(f, "kustomization.yaml") {
			docs = append(docs, depYAMLDocs(t, f)...)
		}
	}
	return docs
}

func k8sContainers(t *testing.T) []any {
	t.Helper()
	var out []any
	for _, d := range k8sDocs(t) {
		if d["kind"] == "Deployment" {
			out = append(out, digAnyList(d, "spec", "template", "spec", "containers")...)
		}
	}
	return out
}

// k8sDeployment is the Deployment with a container named name, and that
// container.
func k8sDeployment(t *testing.T, name string) (deploy, container map[string]any) {
	t.Helper()
	for _, d := range k8sDocs(t) {
		if d["kind"] != "Deployment" {
			continue
		}
		for _, c := range digAnyList(d, "spec", "template", "spec", "containers") {
			if dig(c, "name") == name {
				require.Nil(t, deploy, "one Deployment has a container named %s", name)
				deploy, container = d, c.(map[string]any)
			}
		}
	}
	require.NotNil(t, deploy, "a Deployment with a container named %s", name)
	return deploy, container
}

func TestDeploymentsKubernetes(t *testing.T) {
	t.Parallel()
	for _, d := range k8sDocs(t) {
		require.NotEmpty(t, d["apiVersion"], "every manifest has an apiVersion")
		require.NotEmpty(t, digString(d, "metadata", "name"), "every manifest has a name")
	}
	deploy, c := k8sDeployment(t, "disbatchd")
	require.Equal(t, 2, dig(deploy, "spec", "replicas"))

	// kustomization.yaml names files that exist, and every manifest.
	kust := depYAMLDocs(t, "kubernetes/kustomization.yaml")[0]
	resources := digStrings(kust, "resources")
	for _, r := range resources {
		require.FileExists(t, filepath.Join(deploymentsDir, "kubernetes", r))
	}
	for _, f := range depFiles(t) {
		if strings.HasPrefix(f, "kubernetes/") && !strings.HasSuffix(f, "kustomization.yaml") {
			require.Contains(t, resources, strings.TrimPrefix(f, "kubernetes/"), "kustomization.yaml lists %s", f)
		}
	}

	pod := digMap(deploy, "spec", "template", "spec")

	// --config names the ConfigMap's file where it is mounted.
	args := append(digStrings(c, "command"), digStrings(c, "args")...)
	i := slices.Index(args, "--config")
	require.GreaterOrEqual(t, i, 0, "the container runs disbatchd --config")
	require.Less(t, i+1, len(args))
	configPath := args[i+1]
	var configJSON string
	for _, m := range digAnyList(c, "volumeMounts") {
		dir := digString(m, "mountPath")
		if !strings.HasPrefix(configPath, strings.TrimSuffix(dir, "/")+"/") {
			continue
		}
		for _, v := range digAnyList(pod, "volumes") {
			if dig(v, "name") != dig(m, "name") {
				continue
			}
			name := digString(v, "configMap", "name")
			require.NotEmpty(t, name, "the mount is a ConfigMap")
			for _, d := range k8sDocs(t) {
				if d["kind"] == "ConfigMap" && digString(d, "metadata", "name") == name {
					configJSON = digString(d, "data", strings.TrimPrefix(configPath, strings.TrimSuffix(dir, "/")+"/"))
				}
			}
		}
	}
	require.NotEmpty(t, configJSON, "%s is a key of the mounted ConfigMap", configPath)
	cfg := checkConfigJSON(t, "kubernetes ConfigMap", configJSON)

	// The environment: node name from the pod, URI from a Secret, tracing.
	env := map[string]map[string]any{}
	for _, e := range digAnyList(c, "env") {
		env[digString(e, "name")] = e.(map[string]any)
	}
	require.Equal(t, "metadata.name", digString(env["DISBATCH_NODE"], "valueFrom", "fieldRef", "fieldPath"), "DISBATCH_NODE from the pod name")
	require.NotEmpty(t, digString(env["DISBATCH_MONGO_URI"], "valueFrom", "secretKeyRef", "name"), "DISBATCH_MONGO_URI from a Secret")
	require.NotEmpty(t, digString(env["DISBATCH_MONGO_URI"], "valueFrom", "secretKeyRef", "key"))
	require.Nil(t, dig(env["DISBATCH_MONGO_URI"], "value"), "no URI (password) in the manifest")
	require.Equal(t, "otlp", digString(env["OTEL_TRACES_EXPORTER"], "value"))
	require.Equal(t, "disbatchd", digString(env["OTEL_SERVICE_NAME"], "value"))
	require.NotEmpty(t, digString(env["OTEL_EXPORTER_OTLP_ENDPOINT"], "value"))

	// Probes on the metrics port, which the config file opens to the pod IP.
	addr, err := metrics.ListenAddr(cfg.MetricsAddr)
	require.NoError(t, err)
	require.NotEmpty(t, addr, "the ConfigMap sets metrics_addr (the probes need it)")
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	require.Equal(t, "0.0.0.0", host, "the kubelet probes the pod IP")
	ports := map[string]string{}
	for _, p := range digAnyList(c, "ports") {
		ports[digString(p, "name")] = fmt.Sprint(dig(p, "containerPort"))
	}
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		require.Equal(t, path, digString(c, probe, "httpGet", "path"), probe)
		p := fmt.Sprint(dig(c, probe, "httpGet", "port"))
		if named, ok := ports[p]; ok {
			p = named
		}
		require.Equal(t, port, p, "%s probes the metrics port", probe)
	}

	grace := graceIn(t, args, cfg.grace(t))
	tgp, ok := dig(pod, "terminationGracePeriodSeconds").(int)
	require.True(t, ok, "terminationGracePeriodSeconds is set")
	require.Greater(t, time.Duration(tgp)*time.Second, grace, "terminationGracePeriodSeconds must exceed --grace")
}

// k8sPort resolves a probe's or a Service's port (a number or the name of
// one of the container's ports) to a number.
func k8sPort(c any, p any) string {
	s := fmt.Sprint(p)
	for _, cp := range digAnyList(c, "ports") {
		if digString(cp, "name") == s {
			return fmt.Sprint(dig(cp, "containerPort"))
		}
	}
	return s
}

// TestDeploymentsKubernetesWeb: disbatch-web's Deployment runs the nodes'
// image on the pod IP with a credentials file from a Secret, probes and
// exposes the port it listens on, and is as locked down as the nodes.
func TestDeploymentsKubernetesWeb(t *testing.T) {
	t.Parallel()
	nodeDeploy, node := k8sDeployment(t, "disbatchd")
	deploy, c := k8sDeployment(t, "disbatch-web")
	replicas, _ := dig(deploy, "spec", "replicas").(int)
	require.GreaterOrEqual(t, replicas, 2, "disbatch-web is stateless: two replicas at least")
	require.Equal(t, digString(node, "image"), digString(c, "image"), "disbatch-web runs the nodes' image")

	l := k8sWebLaunch(t, c)
	require.Equal(t, "/usr/local/bin/disbatch-web", l.program, "the container runs the image's disbatch-web")
	host, port, users := checkWebLaunch(t, l)
	require.Equal(t, "0.0.0.0", host, "the kubelet probes, and the Service reaches, the pod IP")

	// The database: the nodes' Secret, no URI in the manifest.
	env := map[string]map[string]any{}
	for _, e := range digAnyList(c, "env") {
		env[digString(e, "name")] = e.(map[string]any)
	}
	var nodeURI any
	for _, e := range digAnyList(node, "env") {
		if dig(e, "name") == "DISBATCH_MONGO_URI" {
			nodeURI = dig(e, "valueFrom", "secretKeyRef")
		}
	}
	require.NotNil(t, nodeURI)
	require.Equal(t, nodeURI, dig(env["DISBATCH_MONGO_URI"], "valueFrom", "secretKeyRef"), "DISBATCH_MONGO_URI from the nodes' Secret")
	require.Nil(t, dig(env["DISBATCH_MONGO_URI"], "value"), "no URI (password) in the manifest")

	// The credentials file: a file of a Secret, mounted read-only.
	pod := digMap(deploy, "spec", "template", "spec")
	secret := ""
	for _, m := range digAnyList(c, "volumeMounts") {
		dir := strings.TrimSuffix(digString(m, "mountPath"), "/") + "/"
		file, ok := strings.CutPrefix(users, dir)
		if !ok {
			continue
		}
		require.Equal(t, true, dig(m, "readOnly"), "the credentials are mounted read-only")
		for _, v := range digAnyList(pod, "volumes") {
			if dig(v, "name") != dig(m, "name") {
				continue
			}
			secret = digString(v, "secret", "secretName")
			require.NotEmpty(t, secret, "--users %s is in a Secret", users)
			items := digAnyList(v, "secret", "items")
			if len(items) > 0 {
				require.True(t, slices.ContainsFunc(items, func(i any) bool { return digString(i, "path") == file }),
					"the Secret's items put a file at %s", users)
			}
		}
	}
	require.NotEmpty(t, secret, "--users %s is a mounted Secret's file", users)
	require.Contains(t, string(depReadFile(t, "README.md")), "kubectl create secret generic "+secret, "deployments/README.md says how to create the Secret %s", secret)

	// Probes and the container port: the port it listens on.
	var named bool
	for _, p := range digAnyList(c, "ports") {
		named = named || fmt.Sprint(dig(p, "containerPort")) == port
	}
	require.True(t, named, "the container declares port %s", port)
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		require.Equal(t, path, digString(c, probe, "httpGet", "path"), probe)
		require.Equal(t, port, k8sPort(c, dig(c, probe, "httpGet", "port")), "%s probes the port disbatch-web listens on", probe)
	}
	if sp := digMap(c, "startupProbe"); sp != nil {
		require.Equal(t, port, k8sPort(c, dig(sp, "httpGet", "port")), "the startup probe probes the port disbatch-web listens on")
	}
	annotations := digMap(deploy, "spec", "template", "metadata", "annotations")
	if annotations["prometheus.io/scrape"] == "true" {
		require.Equal(t, port, annotations["prometheus.io/port"], "Prometheus scrapes the port disbatch-web listens on")
		require.Equal(t, "/metrics", annotations["prometheus.io/path"])
	}

	// Resources, and the nodes' security context.
	for _, r := range []string{"requests.cpu", "requests.memory", "limits.memory"} {
		require.NotEmpty(t, dig(c, append([]string{"resources"}, strings.Split(r, ".")...)...), "disbatch-web sets resources.%s", r)
	}
	require.Equal(t, digMap(node, "securityContext"), digMap(c, "securityContext"), "the container's securityContext is the node's")
	nodePod := digMap(nodeDeploy, "spec", "template", "spec")
	for k, v := range digMap(nodePod, "securityContext") {
		require.Equal(t, v, dig(pod, "securityContext", k), "the pod's securityContext.%s is the node's", k)
	}

	// A Service selects the pods and reaches the port.
	labels := digMap(deploy, "spec", "template", "metadata", "labels")
	var svc map[string]any
	for _, d := range k8sDocs(t) {
		sel := digMap(d, "spec", "selector")
		if d["kind"] != "Service" || len(sel) == 0 {
			continue
		}
		matches := true
		for k, v := range sel {
			matches = matches && labels[k] == v
		}
		if matches {
			svc = d
		}
	}
	require.NotNil(t, svc, "a Service selects disbatch-web's pods")
	var reaches bool
	for _, p := range digAnyList(svc, "spec", "ports") {
		reaches = reaches || k8sPort(c, dig(p, "targetPort")) == port
	}
	require.True(t, reaches, "Service %s reaches port %s", digString(svc, "metadata", "name"), port)

	webAccepts(t, l, filepath.Join(deploymentsDir, "web-users.example"))
}

// systemdUnit is a unit file under deployments/systemd as SECTION.KEY ->
// its values.
type systemdUnit struct {
	t    *testing.T
	file string
	keys map[string][]string
}

func readSystemdUnit(t *testing.T, file string) systemdUnit {
	t.Helper()
	u := systemdUnit{t: t, file: file, keys: map[string][]string{}}
	section := ""
	for _, line := range strings.Split(string(depReadFile(t, "systemd/"+file)), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s: %q", file, line)
		u.keys[section+"."+k] = append(u.keys[section+"."+k], v)
	}
	return u
}

// one is the value of a key given once.
func (u systemdUnit) one(key string) string {
	u.t.Helper()
	require.Len(u.t, u.keys[key], 1, "%s: %s", u.file, key)
	return u.keys[key][0]
}

// timeoutStop is TimeoutStopSec.
func (u systemdUnit) timeoutStop() time.Duration {
	u.t.Helper()
	stop := u.one("Service.TimeoutStopSec")
	if _, err := strconv.Atoi(stop); err == nil {
		stop += "s" // systemd: a bare number is seconds
	}
	timeout, err := time.ParseDuration(stop)
	require.NoError(u.t, err, "%s: TimeoutStopSec=%s", u.file, stop)
	return timeout
}

// envFile is the example of the unit's EnvironmentFile (by its name, under
// deployments/systemd), checked to be KEY=VALUE lines.
func (u systemdUnit) envFile() map[string]string {
	u.t.Helper()
	name := filepath.Base(strings.TrimPrefix(u.one("Service.EnvironmentFile"), "-"))
	env := map[string]string{}
	for _, line := range strings.Split(string(depReadFile(u.t, "systemd/"+name)), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		require.Regexp(u.t, `^[A-Z_][A-Z0-9_]*=`, line, name)
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	return env
}

func TestDeploymentsSystemd(t *testing.T) {
	t.Parallel()
	unit := readSystemdUnit(t, "disbatchd.service")
	require.Equal(t, "on-failure", unit.one("Service.Restart"))
	require.Equal(t, "SIGTERM", unit.one("Service.KillSignal"))
	require.NotEmpty(t, unit.one("Service.EnvironmentFile"))
	require.NotEmpty(t, unit.one("Install.WantedBy"))

	execStart := strings.Fields(unit.one("Service.ExecStart"))
	require.Equal(t, "disbatchd", filepath.Base(execStart[0]))
	i := slices.Index(execStart, "--config")
	require.Greater(t, i, 0, "ExecStart uses --config")
	cfg := checkConfigJSON(t, "systemd/disbatchd.json", string(depReadFile(t, "systemd/"+filepath.Base(execStart[i+1]))))
	require.Greater(t, unit.timeoutStop(), graceIn(t, execStart, cfg.grace(t)), "TimeoutStopSec must exceed --grace")
	unit.envFile()
}

// TestDeploymentsSystemdWeb: disbatch-web.service runs disbatch-web as
// disbatchd.service runs disbatchd (same user, restart, signal, at least
// its hardening), on this machine's loopback with a credentials file.
func TestDeploymentsSystemdWeb(t *testing.T) {
	t.Parallel()
	node := readSystemdUnit(t, "disbatchd.service")
	unit := readSystemdUnit(t, "disbatch-web.service")
	require.Equal(t, "on-failure", unit.one("Service.Restart"))
	require.Equal(t, "SIGTERM", unit.one("Service.KillSignal"))
	require.NotEmpty(t, unit.one("Install.WantedBy"))
	require.Equal(t, node.one("Service.User"), unit.one("Service.User"), "disbatch-web runs as disbatchd's user")
	require.NotEqual(t, "root", unit.one("Service.User"))
	require.Greater(t, unit.timeoutStop(), httpserver.DefaultShutdownTimeout, "TimeoutStopSec must exceed the server's shutdown")

	// At least disbatchd.service's hardening.
	hardening := 0
	for key, v := range node.keys {
		k := strings.TrimPrefix(key, "Service.")
		if !strings.HasPrefix(k, "Protect") && !strings.HasPrefix(k, "Private") && k != "NoNewPrivileges" {
			continue
		}
		hardening++
		require.NotEmpty(t, v)
		w := unit.one(key)
		require.NotContains(t, []string{"no", "false", "0", "off"}, w, "disbatch-web.service: %s=%s is weaker than disbatchd.service's", k, w)
	}
	require.GreaterOrEqual(t, hardening, 3, "disbatchd.service is hardened")

	execStart := strings.Fields(unit.one("Service.ExecStart"))
	l := webLaunch{where: "systemd/disbatch-web.service", program: execStart[0], args: execStart[1:], env: unit.envFile()}
	require.Equal(t, "disbatch-web", filepath.Base(l.program))
	host, _, users := checkWebLaunch(t, l)
	ip := net.ParseIP(host)
	require.True(t, host == "localhost" || ip != nil && ip.IsLoopback(), "disbatch-web.service listens on loopback by default (deployments/README.md), not %s", host)
	require.Contains(t, string(depReadFile(t, "README.md")), users, "deployments/README.md says where the credentials file is")
	webAccepts(t, l, filepath.Join(deploymentsDir, "web-users.example"))
}

func TestDeploymentsDockerfile(t *testing.T) {
	t.Parallel()
	df := string(depReadFile(t, "Dockerfile"))
	require.GreaterOrEqual(t, strings.Count(df, "\nFROM "), 2, "a multi-stage build")
	pkgs := regexp.MustCompile(`\./(?:cmd|deployments)/[a-z-]+`).FindAllString(df, -1)
	for _, pkg := range pkgs {
		require.DirExists(t, filepath.Join("..", pkg), "the Dockerfile builds %s", pkg)
	}
	require.Regexp(t, `(?m)^ENTRYPOINT \[".*/disbatchd"\]`, df)

	// disbatch-web and the health check program are built and installed
	// where docker-compose.yml and the Kubernetes manifests run them.
	copyRE := regexp.MustCompile(`(?m)^COPY --from=build (.+) /usr/local/bin/$`)
	m := copyRE.FindStringSubmatch(df)
	require.NotNil(t, m, "the Dockerfile copies the binaries to /usr/local/bin/")
	for _, pkg := range []string{"./cmd/disbatchd", "./cmd/disbatch", "./cmd/disbatch-web", "./deployments/healthcheck"} {
		require.Contains(t, pkgs, pkg, "the Dockerfile builds %s", pkg)
		require.Contains(t, strings.Fields(m[1]), "/out/"+filepath.Base(pkg), "the Dockerfile installs %s", filepath.Base(pkg))
	}
	expose := regexp.MustCompile(`(?m)^EXPOSE (.+)$`).FindStringSubmatch(df)
	require.NotNil(t, expose)
	for _, l := range webLaunches(t) {
		if l.where == "docker-compose.yml web" {
			_, port, _ := checkWebLaunch(t, l)
			require.Contains(t, strings.Fields(expose[1]), port, "the image exposes disbatch-web's port")
		}
	}
}

// depConfig is what the tests read from a config file.
type depConfig struct {
	Grace       string `json:"grace"`
	MetricsAddr string `json:"metrics_addr"`
}

func (c depConfig) grace(t *testing.T) time.Duration {
	t.Helper()
	if c.Grace == "" {
		return depGrace
	}
	d, err := time.ParseDuration(c.Grace)
	require.NoError(t, err)
	return d
}

// TestDeploymentsJSONConfigs: every JSON file in deployments/ is a config
// the node accepts.
func TestDeploymentsJSONConfigs(t *testing.T) {
	t.Parallel()
	n := 0
	for _, f := range depFiles(t) {
		if strings.HasSuffix(f, ".json") {
			checkConfigJSON(t, f, string(depReadFile(t, f)))
			n++
		}
	}
	require.Positive(t, n)
}

// checkConfigJSON checks that content is a config file disbatchd accepts:
// it starts the real binary with it (and a MongoDB that never answers, so
// that it gets as far as connecting), and checks metrics_addr, which the
// flags override there.
func checkConfigJSON(t *testing.T, what, content string) depConfig {
	t.Helper()
	var cfg depConfig
	require.NoError(t, json.Unmarshal([]byte(content), &cfg), what)
	_, err := metrics.ListenAddr(cfg.MetricsAddr)
	require.NoError(t, err, "%s: metrics_addr", what)

	path := filepath.Join(t.TempDir(), "disbatchd.json")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	p := startNode(t, []string{"--config", path, "--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200",
		"--node", "config-check", "--metrics-addr", "127.0.0.1:0"})
	p.waitLog("cannot connect to MongoDB; retrying", startWait)
	p.signal(syscall.SIGTERM)
	require.Zero(t, p.wait(15*time.Second), "%s: disbatchd with this config", what)
	return cfg
}

// The example credentials of deployments/web-users.example, which
// docker-compose.yml mounts by default and deployments/README.md prints.
const (
	webExampleUser     = "example"
	webExamplePassword = "EXAMPLE-not-a-secret"
)

// webLaunch is how a deployment runs disbatch-web.
type webLaunch struct {
	where   string            // the deployment, for messages
	program string            // the executable's path
	args    []string          // its arguments
	env     map[string]string // the environment it sets (literal values)
}

// setting is what disbatch-web makes of a flag with its environment
// variable: the last --flag VALUE or --flag=VALUE, else the variable, else
// def.
func (l webLaunch) setting(flag, envVar, def string) string {
	v, found := "", false
	for i, a := range l.args {
		if x, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			v, found = x, true
		} else if a == "--"+flag && i+1 < len(l.args) {
			v, found = l.args[i+1], true
		}
	}
	switch {
	case found:
		return v
	case envVar != "" && l.env[envVar] != "":
		return l.env[envVar]
	}
	return def
}

// webLaunches finds every deployment of disbatch-web in the YAML: compose
// services and Kubernetes containers that run it. (The systemd unit is
// read by its own test.)
func webLaunches(t *testing.T) []webLaunch {
	t.Helper()
	var out []webLaunch
	compose := depYAMLDocs(t, "docker-compose.yml")[0]
	for name, svc := range digMap(compose, "services") {
		if ep := digStrings(svc, "entrypoint"); len(ep) > 0 && filepath.Base(ep[0]) == "disbatch-web" {
			out = append(out, composeWebLaunch(t, name, svc))
		}
	}
	for _, c := range k8sContainers(t) {
		if cmd := digStrings(c, "command"); len(cmd) > 0 && filepath.Base(cmd[0]) == "disbatch-web" {
			out = append(out, k8sWebLaunch(t, c.(map[string]any)))
		}
	}
	require.Len(t, out, 2, "docker-compose.yml and the Kubernetes manifests run disbatch-web once each")
	return out
}

func composeWebLaunch(t *testing.T, name string, svc any) webLaunch {
	t.Helper()
	ep := digStrings(svc, "entrypoint")
	require.NotEmpty(t, ep, "compose service %s has an entrypoint", name)
	l := webLaunch{where: "docker-compose.yml " + name, program: ep[0], args: append(ep[1:], digStrings(svc, "command")...), env: map[string]string{}}
	for k, v := range digMap(svc, "environment") {
		l.env[k] = fmt.Sprint(v)
	}
	return l
}

func k8sWebLaunch(t *testing.T, c map[string]any) webLaunch {
	t.Helper()
	cmd := digStrings(c, "command")
	require.NotEmpty(t, cmd, "container %s has a command", dig(c, "name"))
	l := webLaunch{where: "Kubernetes container " + digString(c, "name"), program: cmd[0], args: append(cmd[1:], digStrings(c, "args")...), env: map[string]string{}}
	for _, e := range digAnyList(c, "env") {
		if v, ok := dig(e, "value").(string); ok {
			l.env[digString(e, "name")] = v
		}
	}
	return l
}

// checkWebLaunch checks what every deployment of disbatch-web must get
// right, and returns where it listens and its credentials file: never
// --insecure, always a credentials file (on a non-loopback address the
// server requires one; the deployments use one everywhere), TLS flags in
// pairs.
func checkWebLaunch(t *testing.T, l webLaunch) (host, port, users string) {
	t.Helper()
	for _, a := range l.args {
		require.NotEqual(t, "insecure", flagName(a), "%s: never --insecure", l.where)
	}
	addr, err := httpserver.ListenAddr("--listen", l.setting("listen", "DISBATCH_WEB_LISTEN", "127.0.0.1:8080"))
	require.NoError(t, err, l.where)
	host, port, err = net.SplitHostPort(addr)
	require.NoError(t, err, l.where)
	users = l.setting("users", "DISBATCH_WEB_USERS", "")
	require.NotEmpty(t, users, "%s: disbatch-web runs with a credentials file (--users or DISBATCH_WEB_USERS)", l.where)
	require.True(t, filepath.IsAbs(users), "%s: --users %s is an absolute path", l.where, users)
	require.Equal(t, l.setting("tls-cert", "", "") == "", l.setting("tls-key", "", "") == "", "%s: --tls-cert and --tls-key go together", l.where)
	return host, port, users
}

// webAccepts starts the real disbatch-web as the deployment does, with
// usersFile for its credentials file and a MongoDB that never answers:
// it must get as far as connecting (so its settings passed every check,
// among them the rule that a non-loopback address needs credentials),
// then stop cleanly on SIGTERM. It listens before it connects (for
// /healthz), so the deployment's host is kept with a free port.
func webAccepts(t *testing.T, l webLaunch, usersFile string) {
	t.Helper()
	abs, err := filepath.Abs(usersFile)
	require.NoError(t, err)
	host, _, err := net.SplitHostPort(l.setting("listen", "DISBATCH_WEB_LISTEN", "127.0.0.1:8080"))
	require.NoError(t, err, "%s: --listen", l.where)
	args := append(slices.Clone(l.args), "--users", abs, "--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200",
		"--listen", net.JoinHostPort(host, "0"))
	var env []string
	for k, v := range l.env {
		env = append(env, k+"="+v)
	}
	p := startWeb(t, args, env...)
	p.waitLog("cannot connect to MongoDB; retrying", startWait)
	p.signal(syscall.SIGTERM)
	require.Zero(t, p.wait(15*time.Second), "%s: disbatch-web as deployed", l.where)
}

// depBins are the binaries the deployments tests build beyond TestMain's,
// by package.
var depBins struct {
	sync.Mutex
	built map[string]string
}

// depBinary builds the package pkg ("./cmd/disbatch-web") once, next to
// TestMain's binaries (which it removes), with the race detector when the
// tests have it.
func depBinary(t *testing.T, pkg string) string {
	t.Helper()
	depBins.Lock()
	defer depBins.Unlock()
	if bin, ok := depBins.built[pkg]; ok {
		return bin
	}
	bin := filepath.Join(filepath.Dir(disbatchdBin), filepath.Base(pkg))
	args := []string{"build", "-o", bin}
	if raceBuild {
		args = append(args, "-race")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = ".." // the module root: the tests run in integration/
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %s:\n%s", strings.Join(cmd.Args[1:], " "), out)
	if depBins.built == nil {
		depBins.built = map[string]string{}
	}
	depBins.built[pkg] = bin
	return bin
}

// startWeb starts disbatch-web as startNode starts disbatchd.
func startWeb(t *testing.T, args []string, env ...string) *proc {
	t.Helper()
	return startProc(t, depBinary(t, "./cmd/disbatch-web"), args, env...)
}

// TestDeploymentsWebUsersExample: the example credentials file is what
// deployments/README.md and docker-compose.yml say: one user, whose
// password they print, marked as an example, with the write role.
func TestDeploymentsWebUsersExample(t *testing.T) {
	t.Parallel()
	example := string(depReadFile(t, "web-users.example"))
	require.Contains(t, example, "EXAMPLE", "the example line is marked")
	require.Contains(t, example, "disbatch-web passwd", "the example says how to make real lines")
	u, err := auth.LoadFile(filepath.Join(deploymentsDir, "web-users.example"))
	require.NoError(t, err)

	r := httptest.NewRequest(http.MethodGet, "/api/v1/queues", nil)
	r.SetBasicAuth(webExampleUser, webExamplePassword)
	p, err := u.Authenticate(r)
	require.NoError(t, err, "the example password authenticates")
	require.Equal(t, webExampleUser, p.Name)
	require.Equal(t, auth.RoleWrite, p.Role)
	r.SetBasicAuth(webExampleUser, webExamplePassword+"x")
	_, err = u.Authenticate(r)
	require.ErrorIs(t, err, auth.ErrBadCredentials)

	require.Contains(t, example, webExamplePassword, "web-users.example prints its password")
	for _, f := range []string{"README.md", "docker-compose.yml"} {
		b := string(depReadFile(t, f))
		require.Contains(t, b, webExamplePassword, "%s prints the example password", f)
		require.Contains(t, b, "web-users.example", "%s names the example file", f)
	}
	readme := string(depReadFile(t, "README.md"))
	for _, s := range []string{"--users", "--tls-cert", "--tls-key", "--insecure", "127.0.0.1:8080", "DISBATCH_WEB_LISTEN", "DISBATCH_WEB_USERS",
		"disbatch-web passwd", "disbatch-web token", "disbatch-web.yaml", "disbatch-web.service"} {
		require.Contains(t, readme, s, "deployments/README.md covers %s", s)
	}
}

// TestDeploymentsWebServes runs disbatch-web as docker-compose.yml does
// (its arguments and environment, the example credentials file), but on a
// free loopback port and the tests' MongoDB, and checks what the
// deployments rely on: /healthz, /readyz and /metrics answer without
// credentials (probes, Prometheus), the API only with them, and the
// image's healthcheck program passes on /healthz.
func TestDeploymentsWebServes(t *testing.T) {
	t.Parallel()
	var l webLaunch
	for _, x := range webLaunches(t) {
		if strings.HasPrefix(x.where, "docker-compose.yml") {
			l = x
		}
	}
	require.NotEmpty(t, l.where)
	uri, db := mongotest.URI(t), mongotest.Database(t)
	users, err := filepath.Abs(filepath.Join(deploymentsDir, "web-users.example"))
	require.NoError(t, err)
	args := append(slices.Clone(l.args), "--listen", "127.0.0.1:0", "--users", users, "--mongo-uri", uri, "--database", db.Name(), "--log-format", "text")
	var env []string
	for k, v := range l.env {
		env = append(env, k+"="+v)
	}
	p := startWeb(t, args, env...)
	p.waitLog("serving the Disbatch HTTP API", startWait)
	m := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)/`).FindStringSubmatch(p.log.String())
	require.NotNil(t, m, "the log says where it serves")
	base := m[1]

	get := func(path, user, password string) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Do(req)
		require.NoError(t, err, "GET %s", path)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		require.Equal(t, http.StatusOK, get(path, "", ""), "GET %s without credentials", path)
	}
	for _, path := range []string{"/api/v1/queues", "/queues"} {
		require.Equal(t, http.StatusUnauthorized, get(path, "", ""), "GET %s without credentials", path)
		require.Equal(t, http.StatusUnauthorized, get(path, webExampleUser, "wrong"), "GET %s with a wrong password", path)
		require.Equal(t, http.StatusOK, get(path, webExampleUser, webExamplePassword), "GET %s with the example credentials", path)
	}
	// The alerts on disbatch-web select series it serves.
	requireAlertSeries(t, scrapeMetrics(t, base), isWebMetric, 2)

	hc := depBinary(t, "./deployments/healthcheck")
	require.Zero(t, runBin(t, hc, "", nil, base+"/healthz").code, "healthcheck on /healthz")
	require.Equal(t, 1, runBin(t, hc, "", nil, base+"/api/v1/queues").code, "healthcheck fails on a 401")

	p.signal(syscall.SIGTERM)
	require.Zero(t, p.wait(15*time.Second))
}
