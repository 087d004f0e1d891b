// A libfabric lane closed while its completion queue holds good completions followed by an
// error (ofi-close.test.ts runs this in a child, which a hang would otherwise take with it).
// Rail B posts receives of 64, 64 and 4 bytes; its I/O thread is held (ioTestStall) while rail
// A sends three 64-byte messages, so that B's queue holds two completions and then the third
// receive's truncation error when B is closed. Prints {"closeMs": ...} and exits 0.
import { split } from '../support/addr';
import { SubKind } from '../../plugin/engine/records';
import { forgetShm, ofiRailPair } from './ofi-pair';

const provider = process.argv[2] || 'tcp';
const lastRecv = Number(process.argv[3] || 4);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(): Promise<void> {
  const { ofi, port, a, b, linkA, linkB, peerB, ma, mb } = ofiRailPair(provider);
  let op = 100;
  for (const [i, len] of [64, 64, lastRecv].entries())
    port.submitOfi(b.thread, b.lane, linkB, op++, SubKind.OFI_RECV, ...split(mb.addr + 64 * i), len, mb.mr, 0, 0, 0, 0, 0, -1);
  port.flush();
  await sleep(300);
  ofi.ioTestStall(b.thread, 4000);
  await sleep(100);
  for (let i = 0; i < 3; i++) port.submitOfi(a.thread, a.lane, linkA, op++, SubKind.OFI_SEND, ...split(ma.addr + 64 * i), 64, ma.mr, peerB, 0, 0, 0, 0, -1);
  port.flush();
  await sleep(800);
  const t0 = performance.now();
  ofi.ioClose(b.lane, false);
  console.log(JSON.stringify({ closeMs: Math.round(performance.now() - t0) }));
  forgetShm();
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi close: ${(err as Error).stack}`);
  process.exit(1);
});
