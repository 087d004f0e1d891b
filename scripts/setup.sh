#!/usr/bin/env bash
# Installs what building and testing tsnet needs: npm packages and Debian's libnode (Node 18).
# Idempotent. Two cases for libnode:
#   1. `apt-get install libnode-dev` works: libnode lives in /usr.
#   2. It is refused (a NodeSource `nodejs` conflicts with node-acorn's dependency):
#      libnode108, libnode-dev and libuv1-dev are unpacked into .deps/libnode, and the
#      four builtins libnode reads from absolute paths (acorn, acorn-walk, cjs-module-lexer,
#      undici under /usr/share/nodejs) are unpacked into /.
# Prints the prefix it chose into .deps/libnode-prefix, which the build reads.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p .deps

log() { printf 'setup: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

have_builtins() {
  [ -e /usr/share/nodejs/acorn/dist/acorn.js ] && [ -e /usr/share/nodejs/acorn-walk/dist/walk.js ] &&
  [ -d /usr/share/nodejs/cjs-module-lexer ] && [ -d /usr/share/nodejs/undici ]
}
have_prefix() { [ -e "$1/include/node/node.h" ] && ls "$1"/lib/*/libnode.so.1* >/dev/null 2>&1 && [ -e "$1/include/uv.h" -o -e /usr/include/uv.h ]; }

apt_updated=0
apt_update() { [ $apt_updated = 1 ] || { log "apt-get update"; as_root apt-get update -qq; apt_updated=1; }; }

prefix=""
if have_prefix /usr && have_builtins; then
  prefix=/usr
elif have_prefix "$root/.deps/libnode/usr" && have_builtins && ldconfig -p | grep -q libcares.so.2; then
  prefix="$root/.deps/libnode/usr"
else
  apt_update
  if as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnode-dev libuv1-dev >/dev/null 2>&1; then
    log "installed libnode-dev with apt-get"
    prefix=/usr
  else
    log "apt-get install libnode-dev was refused here; unpacking Debian's packages instead"
    # Runtime libraries libnode links against; these install without conflicts.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libc-ares2 libuv1 libicu72 libnghttp2-14 libbrotli1 >/dev/null
    debs="$root/.deps/debs"; mkdir -p "$debs"
    (cd "$debs" && apt-get download -qq libnode108 libnode-dev libuv1-dev node-acorn node-cjs-module-lexer node-undici 2>/dev/null)
    rm -rf "$root/.deps/libnode"; mkdir -p "$root/.deps/libnode"
    for p in libnode108 libnode-dev libuv1-dev; do dpkg -x "$debs"/${p}_*.deb "$root/.deps/libnode"; done
    # libnode opens these builtins by absolute path at start-up.
    for p in node-acorn node-cjs-module-lexer node-undici; do as_root dpkg -x "$debs"/${p}_*.deb /; done
    prefix="$root/.deps/libnode/usr"
  fi
fi
have_prefix "$prefix" || { log "no usable libnode under $prefix"; exit 1; }
have_builtins || { log "libnode's builtins are missing under /usr/share/nodejs"; exit 1; }
echo "$prefix" > .deps/libnode-prefix
log "libnode: $prefix ($(sed -n 's/#define NODE_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\)/\2/p' "$prefix/include/node/node_version.h" | paste -sd.))"

# libfabric (the ofi transport opens it at run time; its headers build the native layer, its
# tcp and shm providers run the tests, fi_info helps by hand).
if ! dpkg -s libfabric1 libfabric-dev libfabric-bin >/dev/null 2>&1; then
  apt_update
  log "installing Debian's libfabric"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfabric1 libfabric-dev libfabric-bin >/dev/null
fi

if [ ! -d node_modules/.bin ] || [ package.json -nt node_modules/.package-lock.json ]; then
  log "npm install"
  npm install --no-audit --no-fund >/dev/null
fi
