// Posts to an endpoint of this very process after it closed (ofi-local-main.ts, in a child,
// which a fault would otherwise take with it): shm reaches such an endpoint through its
// region, which its close unmaps, so the engine refuses the post (ECONNREFUSED, "the peer is
// an endpoint of this process that has closed") instead of calling libfabric, both on the I/O
// thread and for an inject from the protocol thread. Without that check the inject died of
// SIGSEGV inside shm.
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC } from '../driver/build-driver';
import { ROOT, missing } from './helpers';

describe.skipIf(!!missing || !HAVE_LIBFABRIC)('engine: posts to a closed endpoint of this process', () => {
  for (const provider of ['shm', 'tcp'])
    it(`${provider}: the send before the close completes; those after it fail with ECONNREFUSED and the process lives`, async () => {
      const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/ofi-local-main.ts', provider], { cwd: ROOT, timeout: 30_000 });
      expect(r.signal, r.stderr.slice(-2000)).toBeNull();
      expect(r.status, r.stderr.slice(-2000)).toBe(0);
      const got = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { before: number; after: number[] };
      expect(got).toEqual({ before: 0, after: [-111, -111] });
      expect(r.stderr).toMatch(/Connection refused \(the peer is an endpoint of this process that has closed\)/);
    }, 60_000);
});
