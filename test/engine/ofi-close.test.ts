// Closing a libfabric lane whose completion queue holds good completions and then an error
// (ofi-close-main.ts, in a child). The close reads what already completed before it closes the
// endpoint; it used to take all 64 entries of its array after each read, not the ones that
// read gave, so a read that gave fewer than the one before (two completions, then the error)
// listed an op twice: an endless loop with the lane's lock held, and every lane of that I/O
// thread stopped with it (tcp;ofi_rxm hung there every run).
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
