#!/usr/bin/env bash
# npm run bundle: a relocatable tsnet for a machine without Node (e.g. Ubuntu 24.04 with only
# NCCL and CUDA). Writes dist/bundle/tsnet/ and dist/bundle/tsnet.tar.xz:
#   libnccl-net-tsnet.so, librccl-net-tsnet.so   the plugin (RUNPATH $ORIGIN/lib)
#   lib/                                         libnode 18 and the libraries it needs (RUNPATH $ORIGIN)
#   js/plugin/                                   the compiled TypeScript
#   share/nodejs/                                builtins libnode reads from /usr/share/nodejs
#   install.sh, INSTALL                          puts the builtins in place (root, once per machine)
#   docs/install.md                              installing on a cluster: root, containers, checks, failures
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh
npm run --silent build

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
command -v patchelf >/dev/null || { as_root apt-get update -qq; as_root apt-get install -y -qq patchelf >/dev/null; }

debs=$root/.deps/debs
mkdir -p "$debs"
pkgs=(libnode108 libicu72 libuv1 libc-ares2 libnghttp2-14 libbrotli1 node-acorn node-cjs-module-lexer node-undici)
missing=()
for p in "${pkgs[@]}"; do ls "$debs"/${p}_*.deb >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  (cd "$debs" && { apt-get download -qq "${missing[@]}" 2>/dev/null || { as_root apt-get update -qq && apt-get download -qq "${missing[@]}"; }; })
fi

out=$root/dist/bundle/tsnet
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
rm -rf "$out" && mkdir -p "$out/lib" "$out/js" "$out/share/nodejs"
for p in "${pkgs[@]}"; do dpkg -x "$debs"/${p}_*.deb "$stage"; done

# Libraries: the real files under their sonames, each finding its neighbours through $ORIGIN.
for so in libnode.so.108 libicuuc.so.72 libicui18n.so.72 libicudata.so.72 libuv.so.1 libcares.so.2 \
          libnghttp2.so.14 libbrotlicommon.so.1 libbrotlidec.so.1 libbrotlienc.so.1; do
  src=$(find "$stage" -name "$so" | head -1)
  [ -n "$src" ] || { echo "bundle: $so not found in the packages" >&2; exit 1; }
  cp -L "$src" "$out/lib/$so"
  patchelf --set-rpath '$ORIGIN' "$out/lib/$so"
done
for flavour in nccl rccl; do
  cp build/lib${flavour}-net-tsnet.so "$out/"
  patchelf --set-rpath '$ORIGIN/lib' "$out/lib${flavour}-net-tsnet.so"
done
cp -r dist/plugin "$out/js/plugin"
find "$out/js" -name '*.map' -delete
for b in acorn acorn-walk cjs-module-lexer undici; do cp -rL "$stage/usr/share/nodejs/$b" "$out/share/nodejs/$b"; done

mkdir -p "$out/docs" && cp docs/install.md "$out/docs/"

cat > "$out/install.sh" <<'SH'
#!/usr/bin/env bash
# Puts the builtins libnode reads at start-up in /usr/share/nodejs (where missing). Needs root
# when one is missing; docs/install.md says why, and what to do without root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
missing=()
for b in "$here"/share/nodejs/*; do [ -e "/usr/share/nodejs/$(basename "$b")" ] || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
  if ! mkdir -p /usr/share/nodejs 2>/dev/null || [ ! -w /usr/share/nodejs ]; then
    echo "tsnet: install.sh must run as root: it copies libnode's builtins into /usr/share/nodejs (see $here/docs/install.md)" >&2
    exit 1
  fi
  cp -r "${missing[@]}" /usr/share/nodejs/
fi
echo "tsnet: builtins in place; use NCCL_NET_PLUGIN=$here/libnccl-net-tsnet.so NCCL_NET=tsnet"
SH
chmod +x "$out/install.sh"
cat > "$out/INSTALL" <<TXT
tsnet $(git rev-parse --short HEAD 2>/dev/null || echo unknown): an NCCL/RCCL network plugin in TypeScript, with its own Node (libnode 18).

1. Unpack anywhere:          tar -xJf tsnet.tar.xz
2. Once per machine (root):  tsnet/install.sh
   libnode reads four builtins (acorn, acorn-walk, cjs-module-lexer, undici) from
   /usr/share/nodejs at start-up; install.sh copies them there if they are missing.
   Containers, running without root, checks and usual failures: tsnet/docs/install.md.
3. Run NCCL with:            NCCL_NET_PLUGIN=/path/to/tsnet/libnccl-net-tsnet.so NCCL_NET=tsnet
   (RCCL: librccl-net-tsnet.so). The libraries find each other through \$ORIGIN: no
   LD_LIBRARY_PATH is needed. NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET shows tsnet loading.
TXT
tar -C "$out/.." -cJf "$out/../tsnet.tar.xz" tsnet
echo "bundle: $(du -sh "$out" | cut -f1) in dist/bundle/tsnet, $(du -h "$out/../tsnet.tar.xz" | cut -f1) as dist/bundle/tsnet.tar.xz"
