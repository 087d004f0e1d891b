// Whose work keeps an I/O thread in its busy-poll window (ofi-spin.test.ts runs this in a
// child). Five rails of NIC 0 on I/O threads 0..4: A writes into B (each in a group of its
// own) every millisecond or so for a while; C, idle, is in a group of its own; D, idle, is in
// A's group (a second rail of A's endpoint); E, in a group of its own, writes into B every
// 4 ms (its own work more recent than kBorrowNs, older than the 2 ms window). Prints
// {"shared": [passes per thread], "borrowed": [...], "cpuUs": [...], "writes": n, "refused":
// the error of a rail asked for group -1}.
import { split } from '../support/addr';
import type { CqeHandler } from '../../plugin/engine/port';
import { SubKind } from '../../plugin/engine/records';
import type { OfiBinding } from '../../plugin/transports/ofi/native-rail';
import { type EngineAddon, engine, portOf, sleep } from './helpers';
import { forgetShm } from './ofi-pair';

const provider = process.argv[2] || 'shm';
const ms = Number(process.argv[3] || 300);

async function main(): Promise<void> {
  const eng = engine(5, 50);
  const ofi = eng as unknown as OfiBinding & EngineAddon;
  const port = portOf(0);
  let landed = 0;
  const quiet: CqeHandler = { onOp: () => {}, onRx: () => {} };
  const atB: CqeHandler = { onOp: (_op, status, _v, _t, _io, imm) => void (status === 0 && imm && landed++), onRx: () => {} };
  ofi.ofiOpen({ provider, hmem: false });
  const links = [quiet, atB, quiet, quiet, quiet].map((h) => port.addLink(h));
  const a = ofi.ofiRail(0, 0, links[0]);
  const b = ofi.ofiRail(0, 1, links[1]);
  const c = ofi.ofiRail(0, 2, links[2]);
  const d = ofi.ofiRail(0, 3, links[3], a.group);
  const e = ofi.ofiRail(0, 4, links[4]);
  if (!a.group || new Set([a.group, b.group, c.group, e.group]).size !== 4 || d.group !== a.group) throw new Error(`groups ${[a, b, c, d, e].map((r) => r.group)}`);
  let refused = '';
  try {
    ofi.ofiRail(0, 0, links[2], -1);
  } catch (err) {
    refused = (err as Error).message;
  }
  const aToB = ofi.ofiInsertPeer(a.lane, b.name);
  const eToB = ofi.ofiInsertPeer(e.lane, b.name);
  ofi.ofiInsertPeer(b.lane, a.name);
  const [ma, mb, me] = [a, b, e].map((r) => ofi.ofiAlloc(r.lane, 4096));
  eng.ioSetSpin(2_000); // longer than A's gaps, shorter than E's
  await sleep(50); // the rails are on their threads (kAddOfi) and every window has closed
  const before = Array.from(eng.ioSpinShared());
  const cpu0 = Array.from(eng.ioStats());
  let op = 100;
  let writes = 0;
  let eAt = 0;
  for (const end = Date.now() + ms; Date.now() < end; ) {
    if (Date.now() - eAt >= 4) {
      // No immediate data: only E's own completion, work on E's thread.
      port.submitOfi(e.thread, e.lane, links[4], op++, SubKind.OFI_WRITE, ...split(me.addr), 64, me.mr, eToB, ...split(mb.remoteBase + 2048), mb.keyLo, mb.keyHi, 0);
      eAt = Date.now();
    }
    port.submitOfi(a.thread, a.lane, links[0], op++, SubKind.OFI_WRITE, ...split(ma.addr), 64, ma.mr, aToB, ...split(mb.remoteBase + 1024), mb.keyLo, mb.keyHi, 0x100 + (writes % 0x100));
    port.flush();
    writes++;
    for (const until = Date.now() + 5_000; landed < writes && Date.now() < until; ) {
      port.poll();
      await sleep(1);
    }
    if (landed < writes) throw new Error(`write ${writes} did not land`);
  }
  const counts = Array.from(eng.ioSpinShared()).map((n, i) => n - before[i]);
  const shared = counts.slice(0, 5);
  const borrowed = counts.slice(5);
  const cpuUs = Array.from(eng.ioStats()).map((us, i) => Math.round(us - cpu0[i]));
  eng.ioSetSpin(0);
  for (const r of [a, b, c, d, e]) ofi.ioClose(r.lane, false);
  forgetShm();
  console.log(JSON.stringify({ shared, borrowed, cpuUs, writes, refused }));
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi spin: ${(err as Error).stack}`);
  forgetShm();
  process.exit(1);
});
