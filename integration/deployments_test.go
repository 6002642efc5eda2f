package integration

// Static checks of deployments/ (no Docker, no cluster): the YAML parses,
// the compose file and the manifests say what deployments/README.md says,
// every disbatchd flag and DISBATCH_* variable used there exists, and the
// JSON configs are accepted by the real binary.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/disbatch-go/disbatch/metrics"
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

// flagName is the name of a --flag or --flag=value token, or "".
func flagName(tok string) string {
	tok = strings.Trim(tok, "`'\",[]()")
	if !strings.HasPrefix(tok, "--") || len(tok) < 3 {
		return ""
	}
	name, _, _ := strings.Cut(tok[2:], "=")
	return name
}

// otherToolFlags are the flags of other programs used in deployments/
// (mongod, mongosh, docker, kubectl, useradd, systemctl, go); any other
// --flag there must be one of disbatchd or of the disbatch CLI.
var otherToolFlags = map[string]string{
	"replSet": "mongod", "bind_ip_all": "mongod", "wiredTigerCacheSizeGB": "mongod",
	"quiet": "mongosh", "host": "mongosh", "eval": "mongosh",
	"build": "docker compose up", "build-arg": "docker build", "from": "Dockerfile COPY",
	"from-literal": "kubectl create secret", "system": "useradd", "no-create-home": "useradd",
	"shell": "useradd", "now": "systemctl", "man": "systemd-analyze", "time": "docker stop",
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
// disbatchd (or to the disbatch CLI) in deployments/ is in its --help, any
// other --flag is a known other tool's, and every DISBATCH_* variable is in
// disbatchd's --help or in the code.
func TestDeploymentsUseOnlyRealFlagsAndVariables(t *testing.T) {
	t.Parallel()
	nodeFlags, nodeHelp := helpFlags(t, disbatchdBin, "--help")
	require.True(t, nodeFlags["metrics-addr"], "disbatchd has --metrics-addr")
	cliFlags := map[string]bool{}
	type cliCmd struct{ flags, subs map[string]bool }
	cliHelp := map[string]cliCmd{} // "queue create" -> its flags and subcommands
	cliCmdOf := func(path []string) cliCmd {
		key := strings.Join(path, " ")
		if c, ok := cliHelp[key]; ok {
			return c
		}
		f, help := helpFlags(t, disbatchBin, append(slices.Clone(path), "--help")...)
		c := cliCmd{flags: f, subs: map[string]bool{}}
		if _, list, ok := strings.Cut(help, "Available Commands:\n"); ok {
			list, _, _ = strings.Cut(list, "\n\n")
			for _, l := range strings.Split(list, "\n") {
				if fs := strings.Fields(l); len(fs) > 0 {
					c.subs[fs[0]] = true
				}
			}
		}
		cliHelp[key] = c
		for name := range f {
			cliFlags[name] = true
		}
		return c
	}
	cliCmdOf(nil)

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
				case isCmd(tok, "disbatch"):
					var path []string
					for _, arg := range toks[j+1:] {
						if !cliCmdOf(path).subs[arg] {
							break
						}
						path = append(path, arg)
					}
					flags := cliCmdOf(path).flags
					for _, arg := range toks[j+1:] {
						if isSep(arg) {
							break
						}
						if name := flagName(arg); name != "" {
							require.True(t, flags[name], "%s:%d: disbatch %s has no flag --%s", f, i+1, strings.Join(path, " "), name)
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

	// Anywhere: every --flag belongs to disbatchd, the CLI or a known tool.
	flagRE := regexp.MustCompile(`(?:^|[\s"'\[,(` + "`" + `])--([a-zA-Z][a-zA-Z0-9_-]*)`)
	for _, f := range depFiles(t) {
		for i, line := range strings.Split(string(depReadFile(t, f)), "\n") {
			for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				if nodeFlags[name] || cliFlags[name] || otherToolFlags[name] != "" {
					continue
				}
				t.Errorf("%s:%d: --%s is not a flag of disbatchd, of disbatch, or of a tool in otherToolFlags", f, i+1, name)
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
	for _, v := range []string{"DISBATCH_MONGO_URI", "DISBATCH_NODE", "DISBATCH_METRICS_ADDR"} {
		require.True(t, seen[v], "deployments/ uses %s", v)
	}
	for v := range seen {
		if strings.Contains(nodeHelp, v) {
			continue
		}
		require.True(t, inGoCode(t, `"`+v+`"`), "%s is used in deployments/ but is neither in disbatchd --help nor in the code", v)
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

func TestDeploymentsKubernetes(t *testing.T) {
	t.Parallel()
	var deploy, configMap map[string]any
	for _, d := range k8sDocs(t) {
		require.NotEmpty(t, d["apiVersion"], "every manifest has an apiVersion")
		require.NotEmpty(t, digString(d, "metadata", "name"), "every manifest has a name")
		switch d["kind"] {
		case "Deployment":
			deploy = d
		case "ConfigMap":
			configMap = d
		}
	}
	require.NotNil(t, deploy, "a Deployment")
	require.NotNil(t, configMap, "a ConfigMap")
	require.Equal(t, 2, dig(deploy, "spec", "replicas"))

	// kustomization.yaml names files that exist.
	kust := depYAMLDocs(t, "kubernetes/kustomization.yaml")[0]
	for _, r := range digStrings(kust, "resources") {
		require.FileExists(t, filepath.Join(deploymentsDir, "kubernetes", r))
	}

	pod := digMap(deploy, "spec", "template", "spec")
	var c map[string]any
	for _, x := range digAnyList(pod, "containers") {
		if dig(x, "name") == "disbatchd" {
			c = x.(map[string]any)
		}
	}
	require.NotNil(t, c, "a container named disbatchd")

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
			if dig(v, "name") == dig(m, "name") {
				require.Equal(t, digString(configMap, "metadata", "name"), digString(v, "configMap", "name"), "the mount is the ConfigMap")
				configJSON = digString(configMap, "data", strings.TrimPrefix(configPath, strings.TrimSuffix(dir, "/")+"/"))
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

func TestDeploymentsSystemd(t *testing.T) {
	t.Parallel()
	unit := map[string][]string{}
	section := ""
	for _, line := range strings.Split(string(depReadFile(t, "systemd/disbatchd.service")), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = strings.Trim(line, "[]")
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "disbatchd.service: %q", line)
		unit[section+"."+k] = append(unit[section+"."+k], v)
	}
	one := func(key string) string {
		require.Len(t, unit[key], 1, "disbatchd.service: %s", key)
		return unit[key][0]
	}
	require.Equal(t, "on-failure", one("Service.Restart"))
	require.Equal(t, "SIGTERM", one("Service.KillSignal"))
	require.NotEmpty(t, one("Service.EnvironmentFile"))
	require.NotEmpty(t, one("Install.WantedBy"))

	exec := strings.Fields(one("Service.ExecStart"))
	require.Equal(t, "disbatchd", filepath.Base(exec[0]))
	i := slices.Index(exec, "--config")
	require.Greater(t, i, 0, "ExecStart uses --config")
	cfg := checkConfigJSON(t, "systemd/disbatchd.json", string(depReadFile(t, "systemd/"+filepath.Base(exec[i+1]))))

	stop := one("Service.TimeoutStopSec")
	if _, err := strconv.Atoi(stop); err == nil {
		stop += "s" // systemd: a bare number is seconds
	}
	timeout, err := time.ParseDuration(stop)
	require.NoError(t, err, "TimeoutStopSec=%s", stop)
	require.Greater(t, timeout, graceIn(t, exec, cfg.grace(t)), "TimeoutStopSec must exceed --grace")

	// The EnvironmentFile's example: KEY=VALUE lines.
	for _, line := range strings.Split(string(depReadFile(t, "systemd/disbatchd.env")), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		require.Regexp(t, `^[A-Z_][A-Z0-9_]*=`, line, "disbatchd.env")
	}
}

func TestDeploymentsDockerfile(t *testing.T) {
	t.Parallel()
	df := string(depReadFile(t, "Dockerfile"))
	require.GreaterOrEqual(t, strings.Count(df, "\nFROM "), 2, "a multi-stage build")
	for _, pkg := range regexp.MustCompile(`\./cmd/[a-z-]+`).FindAllString(df, -1) {
		require.DirExists(t, filepath.Join("..", pkg), "the Dockerfile builds %s", pkg)
	}
	require.Regexp(t, `(?m)^ENTRYPOINT \[".*/disbatchd"\]`, df)
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
