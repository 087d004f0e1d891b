// Whose work keeps an I/O thread polling without sleep (its busy-poll window) where it serves a
// libfabric endpoint without a wait fd (shm): its own, that of the other rails of its
// endpoints (ofiRail's group), and any endpoint's while its own worked in the last 10 ms; never
// another endpoint's alone. Before, any such thread's work opened every such thread's window,
// so each protocol thread's endpoint kept an I/O thread spinning while one of them carried
// messages (docs/performance.md, item 32). ofi-spin-main.ts runs in a child: rail A writes
// into B; C (a group of its own) and D (A's group) are idle; E (a group of its own) writes
// every 4 ms.
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { HAVE_LIBFABRIC } from '../driver/build-driver';
import { runAsync } from '../support/spawn';
import { ROOT, missing } from './helpers';

describe.skipIf(!!missing || !HAVE_LIBFABRIC)('engine: busy-poll windows shared by the rails of one endpoint only', () => {
  it('shm: an idle rail of the busy endpoint polls on in its window, an endpoint that worked lately too, an idle endpoint not', async () => {
    const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/ofi-spin-main.ts', 'shm', '500'], {
      cwd: ROOT,
      timeout: 30_000,
      env: { ...process.env, FI_PROVIDER: 'shm' },
    });
    expect(r.status, r.stderr.slice(-2000)).toBe(0);
    const seen = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { shared: number[]; borrowed: number[]; cpuUs: number[]; writes: number; refused: string };
    expect(seen.writes).toBeGreaterThan(0);
    expect(seen.refused).toMatch(/ofiRail: the group must be a number from 0 to 2\^32 - 1/);
    expect([seen.shared[2], seen.borrowed[2]]).toEqual([0, 0]); // C: other endpoints' work never opened its window
    expect(seen.shared[3]).toBeGreaterThan(0); // D: A's rail, polled on while A worked
    expect(seen.shared[4]).toBe(0); // E: no other rail in its group
    expect(seen.borrowed[4]).toBeGreaterThan(0); // E: its own last write within 10 ms, A's within its window
  }, 60_000);
});
