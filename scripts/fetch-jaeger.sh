#!/usr/bin/env bash
# fetch-jaeger.sh: make a Jaeger v2 (1.76.0) all-in-one binary available for
# the tests (internal/jaegertest).
#
# Jaeger publishes no Go-installable binary (`go install` refuses its module
# because go.mod has replace directives), so this builds ./cmd/jaeger from a
# writable copy of the module source in the Go module cache. Cold (empty Go
# build cache) that takes minutes: about 3.5 on 2 cores, downloads included,
# more on a slow network or machine. It yields a ~120 MB binary, cached at
#   ${XDG_CACHE_HOME:-$HOME/.cache}/disbatch/jaeger/1.76.0/jaeger
# which is where internal/jaegertest looks for it (see jaegertest.Binary).
#
# If DISBATCH_JAEGER is set, that binary is used instead and nothing is built.
set -euo pipefail

readonly version="1.76.0"
readonly module="github.com/jaegertracing/jaeger"

die() {
	echo "fetch-jaeger: $*" >&2
	exit 1
}

say() {
	echo "fetch-jaeger: $*"
}

# runs BINARY: true if BINARY is executable and `BINARY version` exits 0
# within a few seconds.
runs() {
	[[ -f "$1" && -x "$1" ]] || return 1
	if command -v timeout >/dev/null 2>&1; then
		timeout 20 "$1" version >/dev/null 2>&1
	else
		"$1" version >/dev/null 2>&1
	fi
}

if [[ -n "${DISBATCH_JAEGER:-}" ]]; then
	runs "$DISBATCH_JAEGER" || die "DISBATCH_JAEGER=$DISBATCH_JAEGER does not run (\`$DISBATCH_JAEGER version\` failed)"
	say "using DISBATCH_JAEGER=$DISBATCH_JAEGER"
	exit 0
fi

cache_home="${XDG_CACHE_HOME:-}"
if [[ -z "$cache_home" ]]; then
	[[ -n "${HOME:-}" ]] || die "neither XDG_CACHE_HOME nor HOME is set"
	cache_home="$HOME/.cache"
fi
target_dir="$cache_home/disbatch/jaeger/$version"
target="$target_dir/jaeger"

if runs "$target"; then
	say "jaeger $version already at $target"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "go is required to build jaeger (or set DISBATCH_JAEGER to a jaeger v2 binary)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/disbatch-fetch-jaeger.XXXXXX")"
partial=""
ticker=""
cleanup() {
	if [[ -n "$ticker" ]]; then kill "$ticker" 2>/dev/null || true; fi
	# The copied module tree is read-only where go mod download left it so.
	chmod -R u+w "$tmp" 2>/dev/null || true
	rm -rf "$tmp"
	if [[ -n "$partial" ]]; then rm -f "$partial"; fi
}
trap cleanup EXIT

start=$SECONDS
say "downloading $module@v$version source (go mod download) ..."
# Run outside any module so the caller's go.mod plays no part.
json="$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$module@v$version")" ||
	die "go mod download $module@v$version failed: $json"
dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json" | head -n1)"
[[ -n "$dir" && -f "$dir/go.mod" ]] || die "no module directory in go mod download output: $json"
say "source at $dir"

src="$tmp/src"
say "copying source to $src ..."
cp -r "$dir" "$src"
chmod -R u+w "$src"

mkdir -p "$target_dir"
partial="$(mktemp "$target_dir/.jaeger.XXXXXX")"
say "building ./cmd/jaeger (downloads its dependencies, then compiles; minutes when cold) ..."
# A line every 30 s, so that a CI log shows the build is still going.
(
	trap - EXIT
	while sleep 30 </dev/null >/dev/null 2>&1; do say "still building ($((SECONDS - start)) s so far) ..."; done
) &
ticker=$!
(
	cd "$src"
	# -mod=mod: the module zip has no vendor directory and go.sum may need
	# entries for the build list; GOWORK=off: ignore any enclosing workspace;
	# -buildvcs=false: the copy is no repository (but $TMPDIR might be in one).
	# The -X sets what `jaeger version` reports (Jaeger's own release
	# builds set it from git tags, which a module copy does not have).
	GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -buildvcs=false \
		-ldflags "-X $module/internal/version.latestVersion=v$version" \
		-o "$partial" ./cmd/jaeger
) || die "go build ./cmd/jaeger failed"
kill "$ticker" 2>/dev/null || true
ticker=""
chmod 0755 "$partial"

runs "$partial" || die "the built jaeger does not run (\`jaeger version\` failed)"

mv -f "$partial" "$target"
partial=""
say "jaeger $version installed at $target ($(du -h "$target" | cut -f1), $((SECONDS - start)) s)"
