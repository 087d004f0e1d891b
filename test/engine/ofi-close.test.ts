// Closing a libfabric lane whose completion queue holds good completions and then an error
// (ofi-close-main.ts, in a child). The close reads what already completed before it closes the
// endpoint; it used to take all 64 entries of its array after each read, not the ones that
// read gave, so a read that gave fewer than the one before (two completions, then the error)
// listed an op twice: an endless loop with the lane's lock held, and every lane of that I/O
// thread stopped with it (tcp;ofi_rxm hung there every run). Then a close that gives up on an
// I/O thread stuck inside a poll (ofi-abandon-main.ts): once back, the thread must report
// nothing of that poll (over tcp it reported the 4 completions it had taken) and close the
// endpoint without polling it first (a poll progresses the provider, which may copy into a
// receive whose memory is NCCL's again). Until the thread has, the endpoint counts as
// abandoned, and the last finalize's wait for it (ofiAwaitAbandoned) ends when it is closed.
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC } from '../driver/build-driver';
import { ROOT, missing } from './helpers';

describe.skipIf(!!missing || !HAVE_LIBFABRIC)('engine: a libfabric lane closed with completions and an error queued', () => {
  for (const [provider, last, what] of [
    ['tcp', 4, 'two completions, then a truncation error'],
    ['shm', 4, 'two completions, then a truncation error'],
    ['tcp', 64, 'three completions'],
  ] as const)
    it(`${provider}: ${what}: ioClose returns`, async () => {
      const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/ofi-close-main.ts', provider, String(last)], {
        cwd: ROOT,
        timeout: 30_000,
      });
      expect(r.signal, `the close did not return in 30 s: ${r.stderr.slice(-2000)}`).toBeNull();
      expect(r.status, r.stderr.slice(-2000)).toBe(0);
      const { closeMs } = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { closeMs: number };
      expect(closeMs).toBeLessThan(5000);
    }, 60_000);
});

describe.skipIf(!!missing || !HAVE_LIBFABRIC)('engine: a libfabric lane whose close gave up on its I/O thread, stuck in a poll', () => {
  for (const provider of ['tcp', 'shm'])
    it(`${provider}: once back, the thread reports nothing and leaves the given-back memory alone`, async () => {
      const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/ofi-abandon-main.ts', provider], { cwd: ROOT, timeout: 30_000 });
      expect(r.signal, r.stderr.slice(-2000)).toBeNull();
      expect(r.status, r.stderr.slice(-2000)).toBe(0);
      expect(r.stderr + r.stdout).toMatch(/its I\/O thread is stuck inside libfabric; the endpoint is abandoned/);
      const got = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as {
        closeMs: number; completionsAfterClose: number; sendsDone: number; intact: boolean;
        abandoned: number; abandonedLeft: number; awaitMs: number; regionsAbandoned: number; regionsAfter: number;
      };
      expect(got.closeMs).toBeLessThan(5000);
      expect(got.sendsDone).toBe(4);
      expect(got.completionsAfterClose).toBe(0);
      expect(got.intact).toBe(true);
      // The last finalize's wait: B counted until its thread closed it, then no longer; over
      // shm its region went with it (A's stays until A closes).
      expect(got.abandoned).toBe(1);
      expect(got.abandonedLeft).toBe(0);
      expect(got.awaitMs).toBeLessThan(1500 + 5000);
      if (provider === 'shm') expect([got.regionsAbandoned, got.regionsAfter]).toEqual([2, 1]);
    }, 60_000);
});
