#!/usr/bin/env bash
# npm test: installs what it needs, builds, checks generated files are fresh, runs every suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm run --silent build
node dist/codegen/main.js --check
npx vitest run "$@"
