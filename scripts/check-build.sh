#!/usr/bin/env bash
# The first step of `npm run build`: checks that what scripts/setup.sh provides is there (the
# npm packages, libnode's headers and library, libuv's header and library: the same places
# CMakeLists.txt searches) and, when something is missing, stops with one line naming it and
# `npm run setup`. It never installs anything itself: setup may need root and the network
# (apt-get, /usr/share/nodejs), which a build should not do behind the user's back.
# Usage: scripts/check-build.sh [ROOT] (default: the checkout holding this script).
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
arch=x86_64-linux-gnu

missing() { printf 'build: %s; run npm run setup first\n' "$*" >&2; exit 1; }
some() { for f in "$@"; do [ -e "$f" ] && return 0; done; return 1; }

for f in node_modules/.bin/tsc node_modules/.bin/cmake-js node_modules/node-addon-api/napi.h; do
  [ -e "$root/$f" ] || missing "the npm packages are missing (no $f)"
done

# The prefix CMakeLists.txt uses: the one setup chose, else /usr.
prefix=/usr why="no .deps/libnode-prefix, so /usr"
if [ -s "$root/.deps/libnode-prefix" ]; then
  prefix=$(head -n 1 "$root/.deps/libnode-prefix") why="prefix from .deps/libnode-prefix"
fi
inc=$prefix/include lib=$prefix/lib/$arch
[ "$prefix" = /usr ] || { inc="$inc or /usr/include" lib="$lib or /usr/lib/$arch"; }
[ -e "$prefix/include/node/node.h" ] ||
  missing "libnode's headers are missing (no node.h in $prefix/include/node; $why)"
some "$prefix/include/uv.h" /usr/include/uv.h ||
  missing "libuv's header is missing (no uv.h in $inc; $why)"
some "$prefix/lib/$arch/libnode.so" "$prefix/lib/libnode.so" ||
  missing "libnode is missing (no libnode.so in $prefix/lib/$arch or $prefix/lib; $why)"
some "$prefix/lib/$arch"/libuv.so{,.1} /usr/lib/$arch/libuv.so{,.1} /lib/$arch/libuv.so{,.1} ||
  missing "libuv is missing (no libuv.so in $lib; $why)"
exit 0
