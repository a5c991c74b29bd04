#!/bin/sh
# Fetch lz4.c/lz4.h (from python-lz4's sdist, via pip) into build/lz4src so
# that `make -f kmod/core/host.mk fuzz LZ4_SRC=build/lz4src` instruments
# the lz4 decoder too.  tests/core/test_fuzz.py uses it when present.
set -eu
top=$(cd "$(dirname "$0")/../../.." && pwd)
dst="$top/build/lz4src"
[ -e "$dst/lz4.c" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$top/.venv/bin/pip" download -q --no-binary :all: --no-deps -d "$tmp" lz4
tar -xzf "$tmp"/lz4-*.tar.gz -C "$tmp"
mkdir -p "$dst"
cp "$tmp"/lz4-*/lz4libs/lz4.c "$tmp"/lz4-*/lz4libs/lz4.h "$dst/"
echo "lz4 sources in $dst"
