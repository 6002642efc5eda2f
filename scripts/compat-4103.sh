#!/usr/bin/env bash
# compat-4103.sh (`make compat-4103`): checks disbatch-web against the real
# Disbatch 4.103 Perl programs, the system whose database and clients it
# serves.
#
# What it runs:
#   1. Builds ./cmd/disbatch-web into a temp dir and starts it on a free
#      loopback port (database compat4103_t002, --legacy-tasks-routes,
#      --plugins Disbatch::Plugin::Demo, --web-root 4.103's htdocs).
#   2. 4.103's own t/002_full.t against it: a copy patched at run time with
#      scripts/compat4103/t002.sed (the server runs elsewhere: WEB, MONGO_URI,
#      TEST_DB; no SSL, no auth, no mongod or fork of its own; see the edits
#      there) and run with the Net::HTTP::Client stand-in in
#      scripts/compat4103/. It runs its tasks with 4.103's own node code.
#      Every test must pass and the plan must be complete (628 tests).
#   3. Database compat4103_cli, emptied and given the indexes a 4.103 node
#      makes (4.103's Disbatch->ensure_indexes), a fresh disbatch-web on it,
#      and 4.103's CLI,
#      bin/disbatch: plugins, queues, status, create-queue, update-queue,
#      create-task, create-tasks (also --collection), tasks (--count,
#      query operators, empty values, --limit 1, --fields, --epoch,
#      --pretty), delete-queue; then a disbatch-web with --users (a file
#      from `disbatch-web passwd`) and the CLI's --username/--password:
#      right password works, wrong or none fails.
#   One line per check; exits non-zero with a list of what failed.
#   Takes about a minute (t/002_full.t is most of it), more when go build
#   starts from a cold cache or the machine is busy.
#
# What it needs (it fails, saying so, when any is missing; it never skips):
#   * The Disbatch 4.103 source tree in PERL_DISBATCH_SRC (default
#     /tmp/perl-disbatch-4.103), holding bin/disbatch and t/002_full.t.
#     The project never stores that code nor fetches it, so CI cannot run
#     this target. To get it: fetch github:manwar/disbatch (and, for
#     start-web, github:gitpan/Limper, Limper-SendFile, Limper-SendJSON) with
#     the search tool's fetch, run /work/shared/perl-disbatch/install-deps,
#     then run /work/shared/perl-disbatch/start-web once (with DISBATCH_MIRROR
#     set to the folder fetch fills), which extracts the source to
#     /tmp/perl-disbatch-4.103.
#   * The Perl modules 4.103 uses (Debian packages: install-deps above) and
#     the shims for this machine's newer Perl and MongoDB driver in
#     PERL_DISBATCH_SHIMS (default /work/shared/perl-disbatch/lib).
#   * A MongoDB replica set: MONGODB_URI if set (the databases compat4103_t002
#     and compat4103_cli on it are dropped), else a throwaway single-member
#     replica set from the cached mongod (`make mongod`; or DISBATCH_MONGOD,
#     or mongod on PATH) on a free port, removed at exit.
#   * Go, to build ./cmd/disbatch-web (DISBATCH_WEB_BIN names a prebuilt
#     disbatch-web to check instead).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
here=$repo/scripts/compat4103
src=${PERL_DISBATCH_SRC:-/tmp/perl-disbatch-4.103}
shims=${PERL_DISBATCH_SHIMS:-/work/shared/perl-disbatch/lib}
plugin=Disbatch::Plugin::Demo
t002_db=compat4103_t002
cli_db=compat4103_cli
t002_plan=628 # 4.103's t/002_full.t with V400_API=1 against 4.103's own server

readonly GET_CODE="How to get it: fetch github:manwar/disbatch with the search tool's fetch,
  run /work/shared/perl-disbatch/install-deps, then set PERL_DISBATCH_SRC to the
  extracted source, e.g. by running /work/shared/perl-disbatch/start-web once
  (DISBATCH_MIRROR=<the folder fetch fills> start-web URI DB PORT; then kill -- -PID),
  which extracts it to /tmp/perl-disbatch-4.103. See the header of $0."

say() { printf '%s\n' "$*"; }
precondition() { # fails the whole run before anything starts
	printf 'compat-4103: %s\n' "$@" >&2
	exit 2
}

# --- results -----------------------------------------------------------------
failed=()
passed=0
ok() {
	passed=$((passed + 1))
	say "ok   $1"
}
bad() { # label, why
	failed+=("$1")
	say "FAIL $1: $2"
}
indent() { sed -e 's/^/       /' | head -n "${1:-20}"; }

# --- cleanup -----------------------------------------------------------------
tmp=""
mongod_pid=""
t002_pgid=""
web_pids=()
drop_dbs=0
mongo_uri=""
stop_pid() { # pid: TERM, then KILL after 10 s
	local pid=$1 i
	kill "$pid" 2>/dev/null || return 0
	for i in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	return 0
}
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM
	[[ -n $t002_pgid ]] && kill -TERM -- "-$t002_pgid" 2>/dev/null
	for pid in "${web_pids[@]}"; do stop_pid "$pid"; done
	if [[ $drop_dbs = 1 ]]; then
		perl -MMongoDB -e 'my $c = MongoDB->connect(shift); $c->get_database($_)->drop for @ARGV' \
			"$mongo_uri" "$t002_db" "$cli_db" >/dev/null 2>&1 || true
	fi
	[[ -n $mongod_pid ]] && stop_pid "$mongod_pid"
	[[ -n $tmp ]] && rm -rf "$tmp"
	rm -rf "/tmp/$t002_db" # the config dir t/002_full.t makes for its database
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- preconditions -----------------------------------------------------------
say "compat-4103: disbatch-web against the real Disbatch 4.103 (PERL_DISBATCH_SRC=$src)"
for f in bin/disbatch t/002_full.t bin/task_runner lib/Disbatch.pm etc/disbatch/htdocs/index.html; do
	[[ -f $src/$f ]] || precondition "PERL_DISBATCH_SRC=$src does not hold Disbatch 4.103 ($f is missing)." \
		"This target runs the real 4.103 code, which the project never stores nor fetches (so it cannot run in CI)." \
		"$GET_CODE"
done
[[ -f $shims/MongoDBCompat1x.pm && -f $shims/Try/Tiny/Retry.pm ]] ||
	precondition "PERL_DISBATCH_SHIMS=$shims does not hold the Perl shims (MongoDBCompat1x.pm, Try/Tiny/Retry.pm)." \
		"They come with /work/shared/perl-disbatch (lib/); set PERL_DISBATCH_SHIMS to that lib folder."
command -v perl >/dev/null || precondition "perl is not installed." "$GET_CODE"
command -v curl >/dev/null || precondition "curl is not installed (it asks disbatch-web's /healthz)."
if ! out=$(perl -MLWP::UserAgent -MHTTP::Request -MMongoDB -MCpanel::JSON::XS -MFile::Slurp -MText::Table \
	-MText::CSV_XS -MIO::Wrap -MTry::Tiny -MLog::Log4perl -MSafe::Isa -MDateTime -MTime::Moment -Mboolean \
	-MTest::More -e1 2>&1); then
	precondition "Perl modules Disbatch 4.103 needs are missing; run /work/shared/perl-disbatch/install-deps." \
		"$(head -n 2 <<<"$out")"
fi
perl5lib="$here:$shims:$src/lib"
if ! out=$(cd "$src" && PERL5LIB=$perl5lib perl -MMongoDBCompat1x -MTry::Tiny::Retry -MNet::HTTP::Client \
	-MDisbatch -MDisbatch::Roles -e1 2>&1); then
	precondition "Disbatch 4.103 does not load from $src/lib with the shims:" "$(head -n 3 <<<"$out")" "$GET_CODE"
fi
sed --version 2>/dev/null | grep -q 'GNU sed' || precondition "GNU sed is needed (scripts/compat4103/t002.sed)."

if [[ -n ${DISBATCH_WEB_BIN:-} ]]; then
	[[ -x $DISBATCH_WEB_BIN ]] || precondition "DISBATCH_WEB_BIN=$DISBATCH_WEB_BIN is not an executable file."
else
	command -v go >/dev/null || precondition "go is not on PATH (needed to build ./cmd/disbatch-web)."
fi

mongod_bin=""
if [[ -n ${MONGODB_URI:-} ]]; then
	mongo_uri=$MONGODB_URI
else
	cached="${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/disbatch/mongodb/6.0.5/bin/mongod"
	if [[ -n ${DISBATCH_MONGOD:-} ]]; then
		mongod_bin=$DISBATCH_MONGOD
	elif [[ -x $cached ]]; then
		mongod_bin=$cached
	else
		mongod_bin=$(command -v mongod) || mongod_bin=""
	fi
	[[ -n $mongod_bin && -x $mongod_bin ]] ||
		precondition "no MongoDB: set MONGODB_URI to a replica set, or run 'make mongod' (caches mongod at $cached)," \
			"or set DISBATCH_MONGOD to a mongod binary."
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/compat-4103.XXXXXX")
start=$SECONDS
finish() { # the summary; exits 1 if any check failed
	local took=$((SECONDS - start))
	if ((${#failed[@]})); then
		say "compat-4103: FAILED ${#failed[@]} of $((passed + ${#failed[@]})) checks (${took}s):"
		printf '  - %s\n' "${failed[@]}"
		exit 1
	fi
	say "compat-4103: all $passed checks passed (${took}s)"
	exit 0
}

free_port() {
	perl -MIO::Socket::INET -e 'my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1", LocalPort => 0, ReuseAddr => 1) or die "$!\n"; print $s->sockport, "\n"'
}

# --- MongoDB -----------------------------------------------------------------
if [[ -n $mongod_bin ]]; then
	port=$(free_port)
	mkdir -p "$tmp/db"
	"$mongod_bin" --replSet rs0 --port "$port" --bind_ip 127.0.0.1 --dbpath "$tmp/db" \
		--logpath "$tmp/mongod.log" --nounixsocket --oplogSize 256 \
		--setParameter diagnosticDataCollectionEnabled=false >/dev/null 2>&1 </dev/null &
	mongod_pid=$!
	for _ in $(seq 150); do # up to 30 s for the port
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
		kill -0 "$mongod_pid" 2>/dev/null || break
		sleep 0.2
	done
	if ! out=$(perl -MMongoDB -e '
		my $hp = shift;
		my $admin = MongoDB->connect("mongodb://$hp/?connect=direct")->get_database("admin");
		$admin->run_command([replSetInitiate => {_id => "rs0", members => [{_id => 0, host => $hp}]}]);
		for (1 .. 300) {
			my $r = eval { $admin->run_command([isMaster => 1]) };
			exit 0 if $r and $r->{ismaster};
			select undef, undef, undef, 0.1;
		}
		die "no primary after 30 s\n";' "127.0.0.1:$port" 2>&1); then
		bad "mongod replica set on 127.0.0.1:$port" "$(head -n 2 <<<"$out")"
		tail -n 5 "$tmp/mongod.log" 2>/dev/null | indent
		finish
	fi
	mongo_uri="mongodb://127.0.0.1:$port/?replicaSet=rs0"
	ok "mongod replica set rs0 on 127.0.0.1:$port ($("$mongod_bin" --version | head -n 1))"
else
	if ! out=$(perl -MMongoDB -e '
		my $r = MongoDB->connect(shift)->get_database("admin")->run_command([isMaster => 1]);
		die "not a replica set member\n" unless $r->{setName};' "$mongo_uri" 2>&1); then
		bad "MONGODB_URI=$mongo_uri" "$(head -n 2 <<<"$out")"
		finish
	fi
	drop_dbs=1
	ok "replica set at MONGODB_URI=$mongo_uri"
fi

# --- disbatch-web --------------------------------------------------------------
if [[ -n ${DISBATCH_WEB_BIN:-} ]]; then
	web_bin=$DISBATCH_WEB_BIN
	ok "disbatch-web: DISBATCH_WEB_BIN=$web_bin"
else
	web_bin=$tmp/disbatch-web
	if out=$(cd "$repo" && go build -o "$web_bin" ./cmd/disbatch-web 2>&1); then
		ok "go build ./cmd/disbatch-web"
	else
		bad "go build ./cmd/disbatch-web" "does not build"
		indent <<<"$out"
		finish
	fi
fi

web_port="" web_pid=""
start_web() { # label db [flags...]: starts disbatch-web, waits for /healthz
	local label=$1 db=$2 code=""
	shift 2
	web_port=$(free_port)
	"$web_bin" --mongo-uri "$mongo_uri" --database "$db" --listen "127.0.0.1:$web_port" \
		--legacy-tasks-routes --plugins "$plugin" --web-root "$src/etc/disbatch/htdocs/" "$@" \
		>"$tmp/web-$label.log" 2>&1 </dev/null &
	web_pid=$!
	web_pids+=("$web_pid")
	for _ in $(seq 150); do # up to 30 s
		code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$web_port/healthz" 2>/dev/null)
		[[ $code = 200 ]] && break
		kill -0 "$web_pid" 2>/dev/null || break
		sleep 0.2
	done
	if [[ $code = 200 ]]; then
		ok "disbatch-web ($label) on 127.0.0.1:$web_port, database $db: /healthz 200"
		return 0
	fi
	if kill -0 "$web_pid" 2>/dev/null; then
		bad "disbatch-web ($label)" "/healthz did not answer 200 within 30 s (last: ${code:-none})"
	else
		bad "disbatch-web ($label)" "exited at start"
	fi
	tail -n 10 "$tmp/web-$label.log" | indent
	return 1
}
stop_web() {
	local p keep=()
	stop_pid "$web_pid"
	for p in "${web_pids[@]}"; do [[ $p = "$web_pid" ]] || keep+=("$p"); done
	web_pids=("${keep[@]}")
}
show_web_log() { # label: the server's log, when a check against it failed
	if [[ -s $tmp/web-$1.log ]]; then
		say "     disbatch-web log ($1), last lines:"
		tail -n 15 "$tmp/web-$1.log" | indent 15
	else
		say "     disbatch-web log ($1): empty"
	fi
}

# --- 1. t/002_full.t -----------------------------------------------------------
run_t002() {
	local t=$tmp/002_full.t tag missing=() rc
	sed -f "$here/t002.sed" "$src/t/002_full.t" >"$t" || {
		bad "t/002_full.t patch" "sed failed"
		return 1
	}
	for tag in $(grep -v '^#' "$here/t002.sed" | grep -o 'HARNESS([a-z0-9-]*)' | sort -u); do
		[[ $(grep -cF "$tag" "$t") = 1 ]] || missing+=("$tag")
	done
	if ((${#missing[@]})); then
		bad "t/002_full.t patch" "edits that did not apply once: ${missing[*]} (has $src/t/002_full.t changed?)"
		return 1
	fi
	ok "t/002_full.t patched at run time ($(grep -v '^#' "$here/t002.sed" | grep -o 'HARNESS([a-z0-9-]*)' | sort -u | wc -l) edits)"

	start_web t002 "$t002_db" || return 1
	# in a session of its own (it forks task runners), waited for in the
	# background so that a signal to this script stops it at once
	(cd "$src" && WEB="127.0.0.1:$web_port" MONGO_URI="$mongo_uri" TEST_DB="$t002_db" V400_API=1 \
		PERL5LIB="$perl5lib" exec setsid timeout -k 10 900 perl -MMongoDBCompat1x "$t") \
		>"$tmp/t002.tap" 2>"$tmp/t002.err" </dev/null &
	t002_pgid=$!
	wait "$t002_pgid"
	rc=$?
	t002_pgid=""
	local plan nok nnotok
	plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\).*/\1/p' "$tmp/t002.tap" | tail -n 1)
	nok=$(grep -c '^ok [0-9]' "$tmp/t002.tap")
	nnotok=$(grep -c '^not ok [0-9]' "$tmp/t002.tap")
	local why=""
	if [[ -z $plan ]]; then
		why="no plan: the test stopped after $((nok + nnotok)) tests (perl exit $rc)"
	elif ((nok + nnotok != plan)); then
		why="plan 1..$plan but $((nok + nnotok)) tests ran"
	elif ((plan != t002_plan)); then
		why="plan 1..$plan, expected $t002_plan (4.103's own server runs $t002_plan)"
	elif ((nnotok)); then
		why="$nnotok failed"
	elif ((rc != 0)); then
		why="perl exited $rc"
	fi
	if [[ -z $why ]]; then
		ok "t/002_full.t: $nok/$plan passed"
	else
		bad "t/002_full.t" "$nok/${plan:-?} passed; $why"
		grep '^not ok\|^Bail out!' "$tmp/t002.tap" | indent 20
		# Test::More's diagnostics of each failure, without the driver's
		# deprecation warnings and the node's log between them
		awk '/^#   Failed test/ { n = 12 } n && /^#  / { print; n--; next } { n = 0 }' "$tmp/t002.err" | indent 40
		grep -q '^#   Failed test' "$tmp/t002.err" || tail -n 5 "$tmp/t002.err" | indent
		show_web_log t002
	fi
	stop_web
}
run_t002

# --- 2. the CLI ----------------------------------------------------------------
cli_url=""
out_f=$tmp/cli.out err_f=$tmp/cli.err cli_rc=0
cli() { # bin/disbatch --url $cli_url ARGS...
	(cd "$src" && PERL5LIB="$src/lib" timeout -k 5 60 perl bin/disbatch --url "$cli_url" "$@") \
		>"$out_f" 2>"$err_f" </dev/null
	cli_rc=$?
}
# expect LABEL RE...: exit 0 and, for each extended regex RE, a whole line of
# stdout matching it
expect() {
	local label=$1 re
	shift
	if ((cli_rc != 0)); then
		bad "$label" "exit $cli_rc: $(head -c 300 "$err_f" | tr '\n' ' ')"
		return 1
	fi
	for re in "$@"; do
		if ! grep -Eqx -- "$re" "$out_f"; then
			bad "$label" "no line matching /$re/ in stdout: $(head -c 300 "$out_f" | tr '\n' '|')"
			return 1
		fi
	done
	ok "$label"
}
# expect_json LABEL PERL_CONDITION [ARGS...]: exit 0, stdout is JSON, and the
# condition holds with the decoded document in $d, its text in $raw and ARGS
# in @ARGV
expect_json() {
	local label=$1 cond=$2 why
	if ((cli_rc != 0)); then
		bad "$label" "exit $cli_rc: $(head -c 300 "$err_f" | tr '\n' ' ')"
		return 1
	fi
	shift 2
	if why=$(perl -MCpanel::JSON::XS -e '
		my $cond = shift @ARGV;
		local $/; my $raw = <STDIN>;
		my $d = eval { Cpanel::JSON::XS->new->decode($raw) };
		defined $d or do { print "not JSON: ", substr($raw, 0, 200); exit 1 };
		my $ok = eval $cond; die $@ if $@;
		$ok or do { print "condition failed: $cond; stdout: ", substr($raw, 0, 300); exit 1 };' "$cond" "$@" <"$out_f" 2>&1); then
		ok "$label"
	else
		bad "$label" "$(tr '\n' ' ' <<<"$why")"
		return 1
	fi
}
# expect_fail LABEL RE: a non-zero exit and stderr matching RE
expect_fail() {
	local label=$1 re=$2
	if ((cli_rc == 0)); then
		bad "$label" "exit 0, expected a failure; stdout: $(head -c 200 "$out_f" | tr '\n' '|')"
	elif ! grep -Eq -- "$re" "$err_f"; then
		bad "$label" "exit $cli_rc but stderr does not match /$re/: $(head -c 300 "$err_f" | tr '\n' ' ')"
	else
		ok "$label (exit $cli_rc)"
	fi
}

run_cli() {
	local q=compatq qid hex='[0-9a-f]{24}' row fails_before=${#failed[@]}
	if ! out=$(perl -MMongoDB -e 'MongoDB->connect(shift)->get_database(shift)->drop' "$mongo_uri" "$cli_db" 2>&1); then
		bad "drop database $cli_db" "$out"
		return 1
	fi
	# the indexes a 4.103 node makes at start (bin/disbatchd), which GET
	# /tasks requires; made by 4.103's own code as t/002_full.t makes them
	cat >"$tmp/cli-config.json" <<JSON
{"mongohost": "$mongo_uri", "database": "$cli_db", "plugins": ["$plugin"],
 "attributes": {"bson_codec": {"dt_type": "DateTime"}},
 "log4perl": {"level": "INFO", "appenders": {"screen": {"type": "Log::Log4perl::Appender::Screen", "layout": "%m%n", "args": {}}}}}
JSON
	if out=$(cd "$tmp" && PERL5LIB=$perl5lib perl -MMongoDBCompat1x -MDisbatch -e '
		my $d = Disbatch->new(class => "Disbatch", config_file => shift);
		$d->load_config;
		$d->ensure_indexes;' "$tmp/cli-config.json" 2>&1); then
		ok "4.103's Disbatch->ensure_indexes on $cli_db"
	else
		bad "4.103's Disbatch->ensure_indexes on $cli_db" "$(tail -n 3 <<<"$out" | tr '\n' ' ')"
		return 1
	fi
	start_web cli "$cli_db" || return 1
	cli_url=http://127.0.0.1:$web_port
	local c="cli bin/disbatch"

	cli plugins
	expect "$c plugins" "$plugin"
	cli queues
	expect "$c queues (none)" 'ID +\| Plugin +\| Name +\| Threads +\| Queued +\| Running +\| Completed +\| ' '0 total queues\.'
	cli create-queue "$q" "$plugin"
	expect "$c create-queue $q $plugin" "Created queue $q: $hex"
	qid=$(sed -n "s/^Created queue $q: \\([0-9a-f]\\{24\\}\\)\$/\\1/p" "$out_f")
	cli update-queue "$q" threads 2
	expect "$c update-queue $q threads 2" "Updated queue $q: \\{\"threads\":\"2\"\\}"
	row="${qid:-$hex} \\| $plugin \\| $q +\\| 2 +\\| 0 +\\| 0 +\\| 0 +\\| "
	cli queues
	expect "$c queues" "$row" '1 total queues\.'
	cli status
	expect "$c status" "$row" '1 total queues\.'
	cli create-task "$q" k v
	expect "$c create-task $q k v" "Created 1 tasks in queue $q" "$hex"
	cli create-tasks "$q" '[{"a":1},{"b":2}]'
	expect "$c create-tasks $q [2 tasks]" "Created 2 tasks in queue $q" "$hex"
	if out=$(perl -MMongoDB -e 'MongoDB->connect(shift)->get_database(shift)->get_collection("users")
		->insert_many([{username => "foo", migration => "test"}, {username => "bar", migration => "test"}])' \
		"$mongo_uri" "$cli_db" 2>&1); then
		cli create-tasks --collection users "$q" '{"filter":{"migration":"test"},"params":{"u":"document.username"}}'
		expect "$c create-tasks --collection users $q" "Created 2 tasks in queue $q" "$hex"
	else
		bad "insert 2 users documents" "$out"
	fi
	# 4.103's GET /tasks filters on the queue's id (a name answers 500 there)
	local f="{\"queue\":\"$qid\"}"
	cli tasks "$f"
	expect_json "$c tasks {queue}" 'ref $d eq "ARRAY" and @$d == 5
		and !grep { $_->{status} != -2 or $_->{queue}{q{$oid}} ne $ARGV[0] } @$d
		and join(",", sort map { $_->{params}{u} // () } @$d) eq "bar,foo"
		and !grep { $_->{ctime} !~ /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$/ } @$d' "$qid"
	cli tasks --count "$f"
	expect "$c tasks --count" '5 tasks'
	# an object value is query operators, as 4.103 hands it to MongoDB
	cli tasks --count "{\"queue\":\"$qid\",\"status\":{\"\$lte\":-2}}"
	expect "$c tasks --count {queue, status: {\$lte: -2}}" '5 tasks'
	# an empty queue counts for the index (queue, status) and is then left
	# out, as 4.103's own query form sends it
	cli tasks --count "{\"queue\":\"\",\"status\":{\"\$in\":[-2,1]}}"
	expect "$c tasks --count {queue: \"\", status: {\$in: [-2,1]}}" '5 tasks'
	cli tasks --limit 1 "$f"
	expect_json "$c tasks --limit 1" 'ref $d eq "HASH" and $d->{_id}{q{$oid}} =~ /^[0-9a-f]{24}$/'
	cli tasks --fields '["status"]' "$f"
	expect_json "$c tasks --fields [\"status\"]" 'ref $d eq "ARRAY" and @$d == 5
		and !grep { join(",", sort keys %$_) ne "_id,status" } @$d'
	cli tasks --epoch "$f"
	expect_json "$c tasks --epoch" 'ref $d eq "ARRAY" and @$d == 5
		and !grep { $_->{ctime} !~ /^\d+(\.\d+)?$/ or $_->{mtime} !~ /^\d+(\.\d+)?$/ } @$d
		and $raw !~ /"ctime":"/'
	cli tasks --pretty "$f"
	if expect_json "$c tasks --pretty" 'ref $d eq "ARRAY" and @$d == 5'; then
		grep -qx '   {' "$out_f" && grep -qx '      "status" : -2,' "$out_f" ||
			bad "$c tasks --pretty: layout" "not 4.103's 3-space, \" : \" layout: $(head -c 200 "$out_f" | tr '\n' '|')"
	fi
	cli delete-queue "$q"
	expect "$c delete-queue $q" "Deleted queue $q"
	cli queues
	expect "$c queues (after delete)" '0 total queues\.'
	((${#failed[@]} == fails_before)) || show_web_log cli
	stop_web
}
run_cli

# --- 3. the CLI with --username/--password -------------------------------------
run_auth() {
	local c="cli bin/disbatch" fails_before=${#failed[@]} users=$tmp/users
	if printf 's3cret\n' | "$web_bin" passwd alice write >"$users" 2>"$tmp/passwd.err" &&
		grep -q '^user alice write ' "$users"; then
		ok "disbatch-web passwd alice write"
	else
		bad "disbatch-web passwd alice write" "$(head -c 300 "$tmp/passwd.err" "$users" | tr '\n' ' ')"
		return 1
	fi
	start_web auth "$cli_db" --users "$users" || return 1
	cli_url=http://127.0.0.1:$web_port
	cli --username alice --password s3cret queues
	expect "$c --username alice --password s3cret queues" "127\\.0\\.0\\.1:$web_port"$'\t'"alice"$'\t'"s3cret" '0 total queues\.'
	cli --username alice --password s3cret create-queue authq "$plugin"
	expect "$c --username alice ... create-queue authq" 'Created queue authq: [0-9a-f]{24}'
	cli --username alice --password s3cret delete-queue authq
	expect "$c --username alice ... delete-queue authq" 'Deleted queue authq'
	cli --username alice --password wrong queues
	expect_fail "$c --username alice --password wrong queues: refused" '401'
	cli queues
	expect_fail "$c queues without credentials: refused" '401'
	((${#failed[@]} == fails_before)) || show_web_log auth
	stop_web
}
run_auth

finish
