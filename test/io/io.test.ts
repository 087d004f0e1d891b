// The native I/O engine's tests (test/io/io_entry.js) inside the real library: builds
// test/io/io_harness.c, runs it against build/libnccl-net-tsnet.so and checks its verdict.
import { execFileSync, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(__dirname, '../..');
const LIB = path.join(ROOT, 'build/libnccl-net-tsnet.so');
const BIN = path.join(ROOT, 'build/test/io_harness');
const SRC = path.join(ROOT, 'test/io/io_harness.c');
const ENTRY = path.join(ROOT, 'test/io/io_entry.js');
const LANE_JS = path.join(ROOT, 'dist/plugin/transports/native-lane.js');
const missing = [LIB, LANE_JS].filter((f) => !fs.existsSync(f));

function buildHarness(): string {
  const built = fs.existsSync(BIN) ? fs.statSync(BIN).mtimeMs : 0;
  if (fs.statSync(SRC).mtimeMs > built) {
    fs.mkdirSync(path.dirname(BIN), { recursive: true });
    execFileSync('cc', ['-std=c11', '-O2', '-Wall', '-Wextra', '-Werror', '-I', path.join(ROOT, 'native/generated'), SRC, '-o', BIN, '-ldl'], {
      stdio: 'pipe',
    });
  }
  return BIN;
}

describe('native I/O engine (through the built library)', () => {
  if (missing.length) {
    it.skip(`skipped: ${missing.join(', ')} missing; run \`npm run build\` first`, () => {});
    return;
  }
  it('passes io_entry.js: sizes, many ops in flight, EOF, peer close, ioClose, throughput', () => {
    const r = spawnSync(buildHarness(), ['--lib', LIB, '--entry', ENTRY, '--timeout', '240'], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 300_000,
    });
    const out = (r.stdout ?? '') + (r.stderr ?? '');
    for (const line of out.split('\n').filter((l) => /op rate|THROUGHPUT/.test(l))) console.log(line);
    const failed = out.split('\n').filter((l) => /FAIL/.test(l) && !/IO-TESTS/.test(l));
    expect(failed, out.slice(-4000)).toEqual([]);
    expect(out, out.slice(-4000)).toMatch(/IO-TESTS PASSED/);
    expect(r.signal).toBeNull();
    expect(r.status).toBe(0);
  }, 300_000);
});
