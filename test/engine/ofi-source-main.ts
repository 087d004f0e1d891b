// The sender of each completion, from the provider (FI_SOURCE) through the engine's completion
// records to a link's handler (ofi-source.test.ts runs this in a child). Three rails of NIC 0:
// B inserts itself first (AV id 0, as every tsnet endpoint does), then A; C is inserted only
// with argv[3] = 'known'. A and C each send B a message with immediate data, and A writes into
// B with immediate data. Prints {"fromA": id, "fromC": id, "writeFromA": id, "idA": id, "idC": id} (-1: none).
import { split } from '../support/addr';
import type { CqeHandler } from '../../plugin/engine/port';
import { SubKind } from '../../plugin/engine/records';
import type { OfiBinding } from '../../plugin/transports/ofi/native-rail';
import { engine, portOf, sleep } from './helpers';
import { forgetShm } from './ofi-pair';

const provider = process.argv[2] || 'tcp';
const known = process.argv[3] === 'known';

async function main(): Promise<void> {
  const ofi = engine(2, 50) as unknown as OfiBinding;
  const port = portOf(0);
  const seen: { imm: number; src: number; flags: number }[] = [];
  const quiet: CqeHandler = { onOp: () => {}, onRx: () => {} };
  const atB: CqeHandler = { onOp: (_op, status, _v, _t, _io, imm, flags, _hi, src) => void (status === 0 && imm && seen.push({ imm, src, flags })), onRx: () => {} };
  const opened = ofi.ofiOpen({ provider, hmem: false });
  const linkA = port.addLink(quiet);
  const linkB = port.addLink(atB);
  const linkC = port.addLink(quiet);
  const a = ofi.ofiRail(0, 0, linkA);
  const b = ofi.ofiRail(0, 1, linkB);
  const c = ofi.ofiRail(0, 0, linkC);
  const self = ofi.ofiInsertPeer(b.lane, b.name);
  const idA = ofi.ofiInsertPeer(b.lane, a.name);
  const idC = known ? ofi.ofiInsertPeer(b.lane, c.name) : -1;
  const aToB = ofi.ofiInsertPeer(a.lane, b.name);
  const cToB = ofi.ofiInsertPeer(c.lane, b.name);
  const [ma, mb, mc] = [a, b, c].map((r) => ofi.ofiAlloc(r.lane, 4096));
  let op = 100;
  for (let i = 0; i < 2; i++) port.submitOfi(b.thread, b.lane, linkB, op++, SubKind.OFI_RECV, ...split(mb.addr + 64 * i), 64, mb.mr, 0, 0, 0, 0, 0, -1);
  port.flush();
  port.submitOfi(a.thread, a.lane, linkA, op++, SubKind.OFI_SEND, ...split(ma.addr), 64, ma.mr, aToB, 0, 0, 0, 0, 0x111);
  port.submitOfi(c.thread, c.lane, linkC, op++, SubKind.OFI_SEND, ...split(mc.addr), 64, mc.mr, cToB, 0, 0, 0, 0, 0x222);
  port.submitOfi(a.thread, a.lane, linkA, op++, SubKind.OFI_WRITE, ...split(ma.addr + 256), 64, ma.mr, aToB, ...split(mb.remoteBase + 1024), mb.keyLo, mb.keyHi, 0x333);
  port.flush();
  for (const end = Date.now() + 10_000; seen.length < 3 && Date.now() < end; ) {
    port.poll();
    await sleep(5);
  }
  const of = (imm: number) => seen.find((s) => s.imm === imm)?.src ?? -2;
  // The endpoints close (shm removes its regions in /dev/shm then); whatever a region of this
  // process is still there goes too, or a later process given this pid would meet it.
  for (const r of [a, b, c]) ofi.ioClose(r.lane, false);
  const left = forgetShm();
  console.log(JSON.stringify({ source: opened.nics[0].source, sourceWrites: opened.nics[0].sourceWrites, self, idA, idC, fromA: of(0x111), fromC: of(0x222), writeFromA: of(0x333), leftRegions: left }));
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi source: ${(err as Error).stack}`);
  process.exit(1);
});
