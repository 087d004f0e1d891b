// Doorbells for endpoints without a wait fd (native/ofi/ofi_bell.cc), through the real engine
// in a child (ofi-bell-main.ts): over shm each send that comes after a gap, through the I/O
// thread or as an inject from the protocol thread, rings the sleeping receiver's bell once and
// the receiver hears it; its bell's page goes with its endpoint, and bells left by processes
// that are gone (a pid now free, or this pid given to a process started before this one) are
// swept away. With TSNET_OFI_BELL's option
// off, or over tcp (which has a wait fd), there is no bell and the messages still arrive.
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC } from '../driver/build-driver';
import { ROOT, missing } from './helpers';

async function run(provider: string, bell: boolean) {
  const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/ofi-bell-main.ts', provider, bell ? '1' : '0'], { cwd: ROOT, timeout: 30_000 });
  expect(r.signal, r.stderr.slice(-2000)).toBeNull();
  expect(r.status, r.stderr.slice(-2000)).toBe(0);
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { bell: boolean[]; rang: number; heard: number; got: number[]; files: number[]; stale: boolean };
}

describe.skipIf(!!missing || !HAVE_LIBFABRIC)('engine: doorbells of endpoints without a wait fd', () => {
  it('shm: every send after a gap rings the sleeping receiver once, and it hears each ring', async () => {
    const r = await run('shm', true);
    expect(r.got).toEqual([0, 0, 0, 0]);
    expect(r.bell).toEqual([true, true]);
    expect(r.rang).toBe(4);
    expect(r.heard).toBe(4);
    expect(r.files).toEqual([2, 1]); // A's and B's pages; B's went with its endpoint
    expect(r.stale).toBe(false);
  }, 60_000);

  it('shm with bells off, and tcp: no bell, nothing rung, every message delivered', async () => {
    for (const [provider, bell] of [['shm', false], ['tcp', true]] as const) {
      const r = await run(provider, bell);
      expect(r, provider).toEqual({ bell: [false, false], rang: 0, heard: 0, got: [0, 0, 0, 0], files: [0, 0], stale: true });
    }
  }, 60_000);
});
