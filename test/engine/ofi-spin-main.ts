// Whose work keeps an I/O thread in its busy-poll window (ofi-spin.test.ts runs this in a
// child). Four rails of NIC 0 on I/O threads 0..3: A and B, in groups of their own, exchange
// writes for a while; C, idle, is in a group of its own; D, idle, is in A's group (a second
// rail of A's endpoint). Prints {"shared": [passes per thread], "cpuUs": [...], "writes": n}.
import type { CqeHandler } from '../../plugin/engine/port';
import { SubKind } from '../../plugin/engine/records';
import type { OfiBinding } from '../../plugin/transports/ofi/native-rail';
import { type EngineAddon, engine, portOf, sleep } from './helpers';
import { forgetShm } from './ofi-pair';

const provider = process.argv[2] || 'shm';
const ms = Number(process.argv[3] || 300);

async function main(): Promise<void> {
  const eng = engine(4, 50);
  const ofi = eng as unknown as OfiBinding & EngineAddon;
  const port = portOf(0);
  let landed = 0;
  const quiet: CqeHandler = { onOp: () => {}, onRx: () => {} };
  const atB: CqeHandler = { onOp: (_op, status, _v, _t, _io, imm) => void (status === 0 && imm && landed++), onRx: () => {} };
  ofi.ofiOpen({ provider, hmem: false });
  const links = [quiet, atB, quiet, quiet].map((h) => port.addLink(h));
  const a = ofi.ofiRail(0, 0, links[0]);
  const b = ofi.ofiRail(0, 1, links[1]);
  const c = ofi.ofiRail(0, 2, links[2]);
  const d = ofi.ofiRail(0, 3, links[3], a.group);
  if (!a.group || new Set([a.group, b.group, c.group]).size !== 3 || d.group !== a.group) throw new Error(`groups ${[a, b, c, d].map((r) => r.group)}`);
  const aToB = ofi.ofiInsertPeer(a.lane, b.name);
  ofi.ofiInsertPeer(b.lane, a.name);
  const [ma, mb] = [a, b].map((r) => ofi.ofiAlloc(r.lane, 4096));
  eng.ioSetSpin(20_000); // a window far longer than the gaps between writes
  await sleep(50); // the rails are on their threads (kAddOfi) and every window has closed
  const before = Array.from(eng.ioSpinShared());
  const cpu0 = Array.from(eng.ioStats());
  let op = 100;
  let writes = 0;
  for (const end = Date.now() + ms; Date.now() < end; ) {
    port.submitOfi(a.thread, a.lane, links[0], op++, SubKind.OFI_WRITE, ma.addr, 64, ma.mr, aToB, mb.remoteBase + 1024, mb.keyLo, mb.keyHi, 0x100 + (writes % 0x100));
    port.flush();
    writes++;
    for (const until = Date.now() + 5_000; landed < writes && Date.now() < until; ) {
      port.poll();
      await sleep(1);
    }
    if (landed < writes) throw new Error(`write ${writes} did not land`);
  }
  const shared = Array.from(eng.ioSpinShared()).map((n, i) => n - before[i]);
  const cpuUs = Array.from(eng.ioStats()).map((us, i) => Math.round(us - cpu0[i]));
  eng.ioSetSpin(0);
  for (const r of [a, b, c, d]) ofi.ioClose(r.lane, false);
  forgetShm();
  console.log(JSON.stringify({ shared, cpuUs, writes }));
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi spin: ${(err as Error).stack}`);
  forgetShm();
  process.exit(1);
});
