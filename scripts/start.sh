#!/usr/bin/env bash
# npm start: the main job. Builds tsnet and runs the loopback benchmark through the built .so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm run --silent build
if [ -f dist/bench/main.js ]; then
  exec node dist/bench/main.js "$@"
fi
# Until the benchmark lands: the C driver's in-process demo through the real library.
mkdir -p build/test
cc -std=c11 -O2 -I native/generated test/driver/shim.c test/driver/driver.c -o build/test/driver -ldl
TSNET_TRANSPORT=loopback build/test/driver transfer --version 12 --verbose
