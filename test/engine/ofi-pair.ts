// Two libfabric rails of NIC 0 on I/O threads 0 and 1 of the real engine, each the other's
// peer, with 4 KiB of registered memory each: the setup of the ofi-*-main.ts children.
import * as fs from 'fs';
import * as path from 'path';
import type { Port } from '../../plugin/engine/port';
import type { OfiBinding } from '../../plugin/transports/ofi/native-rail';
import { engine, portOf } from './helpers';

export type OfiTestBinding = OfiBinding & { ioTestStall(thread: number, ms: number, lane?: number): void };

/**
 * links: the link ids of rails A and B, made on the port once the engine runs (default 1 and 2).
 * open: more of ofiOpen's options (bell).
 */
export function ofiRailPair(provider: string, links: (port: Port) => [number, number] = () => [1, 2], open: { bell?: boolean } = {}) {
  const ofi = engine(2, 50) as unknown as OfiTestBinding;
  const port = portOf(0);
  const [linkA, linkB] = links(port);
  ofi.ofiOpen({ provider, hmem: false, ...open });
  const a = ofi.ofiRail(0, 0, linkA);
  const b = ofi.ofiRail(0, 1, linkB);
  const peerB = ofi.ofiInsertPeer(a.lane, b.name);
  ofi.ofiInsertPeer(b.lane, a.name);
  return { ofi, port, a, b, linkA, linkB, peerB, ma: ofi.ofiAlloc(a.lane, 4096), mb: ofi.ofiAlloc(b.lane, 4096) };
}

/**
 * Removes what libfabric's shm left in /dev/shm under this process's pid (endpoints these
 * children never close), before the child exits: a later process given the same pid would
 * meet those files (shm refuses the name; the bench counts them as its own). Returns how many.
 */
export function forgetShm(): number {
  const mine = fs.readdirSync('/dev/shm').filter((f) => f.startsWith(`${process.pid}:`));
  for (const f of mine) fs.rmSync(path.join('/dev/shm', f), { force: true });
  return mine.length;
}
