#!/usr/bin/env bash
# npm test: installs what it needs, builds, checks generated files are fresh, runs every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm run --silent build
node dist/codegen/main.js --check
# Native crash reports of test programs (test/support/spawn.ts) go here; a failed run ends by
# printing them, so that the last lines of its output (all that CI may show) name the fault.
crashes=build/test/crash-reports.log
# libfabric shm regions that test programs left in /dev/shm (test/support/spawn.ts removes them
# and notes them here): printed after every run, since nothing else would show such a leak.
shmleft=build/test/shm-left.log
rm -f "$crashes" "$shmleft"
rc=0
npx vitest run "$@" || rc=$?
if [ -s "$shmleft" ]; then
  echo
  echo "libfabric shm regions left in /dev/shm by test programs (removed; $shmleft):"
  cat "$shmleft"
fi
if [ "$rc" -ne 0 ] && [ -s "$crashes" ]; then
  echo
  echo "native crash reports of this run ($crashes):"
  cat "$crashes"
fi
exit "$rc"
