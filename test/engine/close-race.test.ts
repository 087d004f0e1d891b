// Lanes closed from both ends at random moments (close-race.ts). A graceful close may end on
// its I/O thread (the peer's end already seen) before that thread takes the protocol thread's
// kick; the lane was then freed with the kick still to come, which listed freed memory: a hang
// on a garbage mutex, or SIGSEGV (a receiver closing its comm just after the sender closed
// its end, under NCCL or the driver). In process with the plain build, where such a use
// mostly goes unseen and only a hang or a crash fails it; then in a child with the engine built
// under AddressSanitizer, which reports the use at once (the code before the fix failed there
// within 3 s, every seed).
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { libasan } from '../support/asan';
import { runAsync } from '../support/spawn';
import { closeRace } from './close-race';
import { ROOT, engine, missing, portOf } from './helpers';

const IO_THREADS = 2;

describe.skipIf(!!missing)('engine: lanes closed from both ends at random moments', () => {
  it('1500 rounds in process: every close returns, a new pair still carries 1 MiB, every lane is freed', async () => {
    const r = await closeRace(engine(IO_THREADS, 50), portOf(0), IO_THREADS, 1500, 7);
    console.log(`close race in process: ${JSON.stringify(r)}`);
    expect(r.graceful).toBeGreaterThan(1000);
    expect(r.hard).toBeGreaterThan(1000);
  }, 120_000);
});

const ASAN = libasan();
const ASAN_ADDON = path.join(ROOT, 'build/asan/tsnet_engine.node');
if (!ASAN) console.log('skipping the AddressSanitizer close race: gcc has no libasan.so');

describe.skipIf(!!missing || !ASAN)('engine under AddressSanitizer: lanes closed from both ends at random moments', () => {
  it('3 seeds x 1500 rounds: no use of freed memory, and the same checks', async () => {
    execFileSync('cmake', ['--build', 'build', '--target', 'tsnet_engine_asan'], { cwd: ROOT, stdio: 'pipe' });
    expect(fs.existsSync(ASAN_ADDON)).toBe(true);
    // --expose-gc: close-race.ts collects now and then, so that dropped receive rings are collected.
    const env = { ...process.env, LD_PRELOAD: ASAN!, ASAN_OPTIONS: 'detect_leaks=0', TSNET_TEST_ENGINE: ASAN_ADDON, NODE_OPTIONS: '--expose-gc' };
    for (const seed of [7, 8, 9]) {
      const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/close-race-main.ts', '1500', String(seed)], {
        cwd: ROOT,
        env,
        timeout: 240_000,
      });
      console.log(`close race under AddressSanitizer, seed ${seed}: ${r.seconds.toFixed(1)} s ${r.stdout.trim()}`);
      expect(r.stderr, r.stderr.slice(0, 6000)).not.toMatch(/AddressSanitizer/);
      expect(r.status, r.stderr.slice(-2000)).toBe(0);
      expect(r.stdout).toMatch(/"graceful":\d+/);
    }
  }, 600_000);
});
