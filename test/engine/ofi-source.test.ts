// The sender each completion names (FI_SOURCE), carried from the provider through the engine's
// completion records to the protocol thread's handler (ofi-source-main.ts, in a child): what the
// protocol's sender check (plugin/transports/ofi/endpoint.ts, fromPeer) reads. Real providers:
// a message names its sender's AV id at the receiver; a sender the receiver never inserted is
// FI_ADDR_NOTAVAIL (-1) over tcp;ofi_rxm and 0 over shm (the receiver's own id); a remote
// write names its writer over shm only (rxm names none, and the check leaves its writes alone).
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { HAVE_LIBFABRIC } from '../driver/build-driver';
import { runAsync } from '../support/spawn';
import { ROOT, missing } from './helpers';

interface Seen {
  source: boolean;
  sourceWrites: boolean;
  self: number;
  idA: number;
  idC: number;
  fromA: number;
  fromC: number;
  writeFromA: number;
  /** Regions of the child's in /dev/shm after its endpoints closed (removed then). */
  leftRegions: number;
}

async function run(provider: string, known: boolean): Promise<Seen> {
  const r = await runAsync(path.join(ROOT, 'node_modules/.bin/vite-node'), ['test/engine/ofi-source-main.ts', provider, known ? 'known' : 'unknown'], {
    cwd: ROOT,
    timeout: 30_000,
    env: { ...process.env, FI_PROVIDER: provider },
  });
  expect(r.status, r.stderr.slice(-2000)).toBe(0);
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Seen;
}

describe.skipIf(!!missing || !HAVE_LIBFABRIC)('engine: the sender of each libfabric completion (FI_SOURCE)', () => {
  for (const provider of ['tcp', 'shm'])
    it(`${provider}: messages name their sender; an unknown one ${provider === 'tcp' ? 'none (-1)' : '0'}; writes ${provider === 'tcp' ? 'are not checked' : 'name their writer'}`, async () => {
      const k = await run(provider, true);
      expect([k.source, k.sourceWrites]).toEqual([true, provider === 'shm']);
      expect(k.self).toBe(0);
      expect(k.fromA).toBe(k.idA);
      expect(k.fromC).toBe(k.idC);
      expect(k.fromA).not.toBe(k.fromC);
      if (k.sourceWrites) expect(k.writeFromA).toBe(k.idA);
      else expect(k.writeFromA).toBeGreaterThanOrEqual(-1); // the write arrived; who sent it is not known
      const u = await run(provider, false);
      expect(u.fromA).toBe(u.idA);
      expect(u.fromC).toBe(provider === 'tcp' ? -1 : 0);
      expect([k.leftRegions, u.leftRegions]).toEqual([0, 0]); // closing the endpoints removed shm's regions
    }, 60_000);
});
