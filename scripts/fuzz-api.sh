#!/usr/bin/env bash
# fuzz-api.sh (`make fuzz-api`, run by .ci/run): property-based fuzzing of
# the v1 JSON API against its own OpenAPI document with Schemathesis. It
# fails unless every response is no 5xx and matches the document (status
# code, content type, headers, body schema), among the other checks below.
#
# What it runs:
#   1. The cached mongod (scripts/fetch-mongod.sh) and a virtualenv with
#      the pinned Schemathesis below, cached under
#      ${XDG_CACHE_HOME:-~/.cache}/disbatch/schemathesis/ (made once per pin
#      list and Python interpreter, then reused).
#   2. cmd/disbatch-dev, built into a temp dir, on two free loopback ports:
#      a throwaway replica set, a node (dev plugin only: Demo), the web
#      server with live events, and the demo queue with its finished tasks.
#      Then, through the API itself, a queue whose tasks stay queued and a
#      queue for DELETE to delete; their ids, the tasks' ids and the node's
#      name go into Schemathesis's config as dictionaries, so that a share
#      of the generated requests hit real resources (success paths) while
#      the rest stays generated (error paths).
#   3. Schemathesis (all phases: examples, coverage, fuzzing, stateful;
#      every check) against http://127.0.0.1:PORT/api/v1/openapi.json, every
#      operation including the live event stream, with a fixed seed and a
#      bounded number of examples per operation: about two minutes. Its
#      settings, and why, are in the config this script writes (below).
#   Exits non-zero on any failure Schemathesis reports (its report is
#   printed) or when the set-up fails; the processes and temp dir go at exit.
#
# Settings (environment): FUZZ_API_MAX_EXAMPLES (per operation and phase,
# default 300), FUZZ_API_SEED (default fixed; "random" for a new one each
# run: the report prints it, FUZZ_API_SEED=N replays it), FUZZ_API_PYTHON
# (the interpreter of the virtualenv, default python3: CPython >= 3.11 with
# pip), FUZZ_API_KEEP=1 keeps the temp dir (logs, config, reports).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# Schemathesis and everything it installs, pinned (pip freeze of a working
# virtualenv): the same generator and checks on every machine. Changing a
# line here makes a new cached virtualenv.
readonly SCHEMATHESIS_VERSION=4.32.5
readonly PINS="schemathesis==$SCHEMATHESIS_VERSION
anyio==4.16.0
certifi==2026.10.18
charset-normalizer==3.5.2
click==8.5.1
graphql-core==3.3.2
harfile==0.6.0
hypothesis==6.170.15
hypothesis-graphql==0.13.5
idna==3.20
iniconfig==2.3.1
jsonschema_rs==0.60.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
packaging==26.3
pluggy==1.7.0
Pygments==2.21.0
pyrate-limiter==4.5.1
pytest==9.2.0
PyYAML==6.0.3
requests==2.34.2
rich==15.0.0
sortedcontainers==2.4.0
typing_extensions==4.16.0
urllib3==2.8.0
Werkzeug==3.1.9"

max_examples=${FUZZ_API_MAX_EXAMPLES:-300}
seed=${FUZZ_API_SEED:-20260601}
python=${FUZZ_API_PYTHON:-python3}

say() { printf 'fuzz-api: %s\n' "$*"; }
die() {
	printf 'fuzz-api: %s\n' "$@" >&2
	exit 1
}

# --- cleanup -----------------------------------------------------------------
tmp=""
dev_pid=""
partial=""
st_pid=""
cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	if [[ -n $partial ]]; then rm -rf "$partial"; fi
	if [[ -n $st_pid ]]; then
		kill -TERM "$st_pid" 2>/dev/null || true
		wait "$st_pid" 2>/dev/null || true
	fi
	if [[ -n $dev_pid ]]; then
		# disbatch-dev stops its node, web server and replica set on
		# SIGTERM; mongod also dies with it (Pdeathsig) if it must be killed.
		kill -TERM "$dev_pid" 2>/dev/null || true
		for i in $(seq 200); do
			kill -0 "$dev_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$dev_pid" 2>/dev/null || true
		wait "$dev_pid" 2>/dev/null || true
	fi
	if [[ -n $tmp ]]; then
		if [[ ${FUZZ_API_KEEP:-} = 1 ]]; then
			say "kept $tmp"
		else
			rm -rf "$tmp"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$SECONDS
command -v go >/dev/null || die "go is not on PATH (needed to build ./cmd/disbatch-dev)."

# --- 1. mongod and Schemathesis ----------------------------------------------
bash scripts/fetch-mongod.sh

command -v "$python" >/dev/null || die "$python is not on PATH: install CPython >= 3.11 with pip, or set FUZZ_API_PYTHON."
pyver=$("$python" -c 'import platform, sys; print(platform.python_version()); sys.exit(sys.version_info < (3, 11))') ||
	die "$python is Python $pyver; Schemathesis $SCHEMATHESIS_VERSION needs >= 3.11 (set FUZZ_API_PYTHON)."
pyexe=$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')
"$python" -m pip --version >/dev/null 2>&1 ||
	die "$python has no pip (e.g. apt-get install python3-pip, or $python -m ensurepip); set FUZZ_API_PYTHON to another Python."

cache_home=${XDG_CACHE_HOME:-}
if [[ -z $cache_home ]]; then
	[[ -n ${HOME:-} ]] || die "neither XDG_CACHE_HOME nor HOME is set"
	cache_home=$HOME/.cache
fi
# One virtualenv per pin list and interpreter (a venv runs on the Python
# that made it).
pins_key=$(printf '%s\n' "$PINS" "$pyexe" | sha256sum | cut -c1-12)
venv=$cache_home/disbatch/schemathesis/$SCHEMATHESIS_VERSION-py$pyver-$pins_key
st=("$venv/bin/python" -c 'import sys; from schemathesis.cli import schemathesis; sys.argv[0] = "schemathesis"; sys.exit(schemathesis())')
if [[ -f $venv/.ready ]] && "${st[@]}" --version >/dev/null 2>&1; then
	say "Schemathesis $SCHEMATHESIS_VERSION (Python $pyver) already at $venv"
else
	say "installing Schemathesis $SCHEMATHESIS_VERSION into $venv ..."
	mkdir -p "$(dirname "$venv")"
	partial=$(mktemp -d "$venv.partial.XXXXXX")
	# A venv without pip of its own (Debian's python3 has no ensurepip
	# unless python3-venv is installed), filled by this Python's pip.
	# Built aside and moved into place whole; st is run as `python -c`,
	# never through the entry-point scripts, whose #! names the build dir.
	if ! "$python" -m venv --without-pip "$partial" >&2 ||
		! printf '%s\n' "$PINS" >"$partial/requirements.txt" ||
		! "$python" -m pip --python "$partial/bin/python" install --disable-pip-version-check --no-input \
			--quiet -r "$partial/requirements.txt" >&2 ||
		! "$partial/bin/python" -c 'import schemathesis.cli' >&2; then
		die "could not install Schemathesis $SCHEMATHESIS_VERSION with $python and its pip $("$python" -m pip --version | cut -d' ' -f2) (it needs PyPI, and pip >= 22.3 for --python)"
	fi
	touch "$partial/.ready"
	rm -rf "$venv"
	mv -T "$partial" "$venv" 2>/dev/null || rm -rf "$partial" # lost a race: the other one is as good
	partial=""
	"${st[@]}" --version >/dev/null || die "Schemathesis in $venv does not run"
	say "Schemathesis $SCHEMATHESIS_VERSION installed at $venv"
fi
py=$venv/bin/python

# --- 2. replica set, node and web server ---------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/disbatch-fuzz-api.XXXXXX")
say "building ./cmd/disbatch-dev ..."
go build -o "$tmp/bin/disbatch-dev" ./cmd/disbatch-dev

read -r mongo_port web_port < <("$py" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
node=fuzz-node
# In a session of its own (setsid), so that Ctrl-C does not reach its
# mongod before it: cleanup stops it, which stops the node, then mongod.
setsid "$tmp/bin/disbatch-dev" --port "$mongo_port" --dir "$tmp/rs" --node "$node" --web "127.0.0.1:$web_port" \
	>"$tmp/dev.log" 2>&1 </dev/null &
dev_pid=$!
base=http://127.0.0.1:$web_port
say "disbatch-dev (pid $dev_pid): replica set on 127.0.0.1:$mongo_port, web server at $base/"

# Waits for the demo queue's tasks to finish, adds the queues the fuzzer
# needs through the API and writes Schemathesis's config with the real
# resources. Uses the standard library only.
if ! "$py" - "$base" "$node" "$dev_pid" "$tmp/schemathesis.toml" "$seed" "$max_examples" >"$tmp/seed.log" 2>&1 <<'EOF'; then
import json, os, sys, time, urllib.error, urllib.request

base, node, dev_pid, config, seed, max_examples = sys.argv[1:7]

def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")

deadline = time.time() + 120
while True:
    try:
        os.kill(int(dev_pid), 0)
    except ProcessLookupError:
        sys.exit("disbatch-dev exited")
    try:
        code, got = call("GET", "/api/v1/tasks?queue=demo&limit=1000")
        if code == 200 and got["tasks"] and all(t["status"] > 0 for t in got["tasks"]):
            break
    except (OSError, ValueError):
        pass
    if time.time() > deadline:
        sys.exit("the demo queue's tasks did not finish within 120 s")
    time.sleep(0.2)
demo = got["tasks"][0]["queue"]
finished = [t["id"] for t in got["tasks"]]

def must(code, got, want, what):
    if code != want:
        sys.exit(f"{what}: want {want}, got {code}: {got}")
    return got

plugin = "Disbatch::Plugin::Demo"
# maxthreads 0: nothing claims these tasks; they stay queued (an
# unfinished task, empty output; DELETE without force is 409).
held = must(*call("POST", "/api/v1/queues", {"name": "fuzz-held", "plugin": plugin, "maxthreads": 0}), 201, "create queue fuzz-held")["id"]
queued = must(*call("POST", "/api/v1/tasks", {"queue": held, "tasks": [{"params": {"commands": "a"}}, {"params": {"n": 1, "nested": {"k": [1, "x", None]}}}]}), 201, "submit tasks")["ids"]
victim = must(*call("POST", "/api/v1/queues", {"name": "fuzz-victim", "plugin": plugin, "maxthreads": 0}), 201, "create queue fuzz-victim")["id"]
must(*call("POST", "/api/v1/tasks", {"queue": victim, "tasks": [{"params": {"commands": "a"}}]}), 201, "submit a task to fuzz-victim")
must(*call("GET", "/api/v1/nodes/" + node), 200, "get node " + node)

def toml_list(xs):
    return "[" + ", ".join(json.dumps(x) for x in xs) + "]"

with open(config, "w") as f:
    f.write("# Written by scripts/fuzz-api.sh for one run.\n")
    if seed != "random":
        f.write(f"seed = {int(seed)}\n")
    f.write(f"""
# One worker: see "--workers 1" in scripts/fuzz-api.sh.
workers = 1
request-timeout = 10
generation.max-examples = {int(max_examples)}

# Every check: no 5xx; status code, content type, headers and body as the
# document says; invalid input refused, valid input accepted; 405 with
# Allow for other methods; what DELETE deleted is gone, what POST made is
# there; ...
[checks]
enabled = true

# 413 and 431 (the body, or the request line and headers, over the server's
# limits; both documented) refuse a request for its size, which JSON Schema
# cannot bound: right for invalid input, and possible for valid input that
# is simply too big (a query of 32 param keys with 32 long values each).
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "431", "5xx"]
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "431", "5xx"]

# Dictionaries: real values mixed into the generated ones with a
# probability, per parameter (path.X, query.X, body.X), so that requests
# reach the success paths too. Queues go by id, as the fuzzer renames them.
[dictionaries.queues]
values = {toml_list([demo, held, "demo"])}
[dictionaries.victims]
values = {toml_list([victim])}
[dictionaries.tasks]
values = {toml_list(finished + queued)}
[dictionaries.nodes]
values = {toml_list([node])}

[parameters]
"path.queue" = {{ dictionary = "queues", probability = 0.5 }}
"query.queue" = {{ dictionary = "queues", probability = 0.5 }}
"body.queue" = {{ dictionary = "queues", probability = 0.5 }}
"path.id" = {{ dictionary = "tasks", probability = 0.5 }}
"query.cursor" = {{ dictionary = "tasks", probability = 0.3 }}
"path.node" = {{ dictionary = "nodes", probability = 0.5 }}
"query.node" = {{ dictionary = "nodes", probability = 0.3 }}

# DELETE gets the victim queue only, so that the others live.
[[operations]]
include-name = "DELETE /api/v1/queues/{{queue}}"
parameters = {{ "path.queue" = {{ dictionary = "victims", probability = 0.3 }} }}

# The live event stream never ends: Schemathesis reads it for up to
# request-timeout seconds (or 3 events) and checks what came. Its
# parameters are read leniently by web/live (comma-separated lists,
# trimmed, empty values ignored, ids in either case, opaque resume tokens,
# queue names that must exist: 400 otherwise), which the document states
# in words that no schema could check; so the two checks of the request
# against the schema are off for it, the response checks stay on.
[[operations]]
include-path = "/api/v1/events"
request-timeout = 0.5
max-stream-events = 3
generation.max-examples = {min(int(max_examples), 30)}
checks.positive_data_acceptance.enabled = false
checks.negative_data_rejection.enabled = false
# Most generated queue names name no queue: mostly 400s, by design.
warnings = false
""")
print("demo", demo, "held", held, "victim", victim, "tasks", finished + queued)
EOF
	cat "$tmp/seed.log" >&2
	say "disbatch-dev's log:" >&2
	tail -n 30 "$tmp/dev.log" >&2
	die "setting up the API's data failed"
fi
say "seeded: $(tail -n 1 "$tmp/seed.log")"

# --- 3. Schemathesis -----------------------------------------------------------
# The settings are in the config written above (the command line would
# override its per-operation ones).
#
# workers = 1: CPython 3.11 before 3.11.8 (Debian 12's 3.11.2 included) and
# 3.12 before 3.12.2 keep the AST constructor's recursion depth in
# interpreter-wide state (CPython gh-106905, fixed by PRs 113472/113476),
# so two threads in ast.parse at once corrupt it and one of them raises
# "SystemError: AST constructor recursion depth mismatch". Hypothesis calls
# ast.parse to describe lambdas, in every Schemathesis worker: with more
# than one worker such a Python fails runs at random. One worker never
# does, and is fast enough here (about 50 test cases a second).
args=(run "$base/api/v1/openapi.json")
if [[ ${FUZZ_API_KEEP:-} = 1 ]]; then
	args+=(--report junit,ndjson --report-dir "$tmp/report")
fi
say "Schemathesis $SCHEMATHESIS_VERSION, Python $("$py" -c 'import platform; print(platform.python_version())'): ${max_examples} examples per operation, seed $seed"
rc=0
# timeout: a bound on a hung run (a normal one takes a few minutes);
# --foreground keeps it in this process group, so that Ctrl-C reaches it.
# In the background with wait, so that a signal to this script is handled
# at once (cleanup stops it).
(cd "$tmp" && exec timeout --foreground --kill-after 30 600 "${st[@]}" --config-file "$tmp/schemathesis.toml" "${args[@]}") &
st_pid=$!
wait "$st_pid" || rc=$?
st_pid=""
if [[ $rc -eq 130 || $rc -eq 143 ]]; then
	die "interrupted"
fi
if [[ $rc -ne 0 ]]; then
	if [[ $rc -eq 124 || $rc -eq 137 ]]; then
		say "Schemathesis did not finish within 10 minutes" >&2
	fi
	say "disbatch-dev's log (last lines):" >&2
	tail -n 40 "$tmp/dev.log" >&2
	die "FAILED (exit $rc, $((SECONDS - start)) s): the v1 API does not match its OpenAPI document or answered 5xx; the report is above"
fi
if ! kill -0 "$dev_pid" 2>/dev/null; then
	tail -n 40 "$tmp/dev.log" >&2
	die "disbatch-dev exited during the run"
fi
if grep -q 'level=ERROR' "$tmp/dev.log"; then
	grep 'level=ERROR' "$tmp/dev.log" | head -n 20 >&2
	die "the server logged errors during the run"
fi
say "passed in $((SECONDS - start)) s"
