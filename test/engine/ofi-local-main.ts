// Two libfabric rails of this process, each the other's peer (ofi-local.test.ts runs this in a
// child): A sends to B, B's endpoint closes, and A sends to it again, through its I/O thread
// and as an inject from this thread. shm reaches an endpoint of its own process through that
// endpoint's region, unmapped once it closed: the sends after the close must end in an error
// (ECONNREFUSED) instead of touching it (a CLOSE message sent there was a SIGSEGV). Prints
// {"before": status, "after": [statuses]} and exits 0.
import { split } from '../support/addr';
import { SubKind } from '../../plugin/engine/records';
import { forgetShm, ofiRailPair } from './ofi-pair';

const provider = process.argv[2] || 'shm';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(): Promise<void> {
  const status = new Map<number, number>();
  const handler = { onOp: (op: number, st: number) => void status.set(op, st), onRx: () => {} };
  const { ofi, port, a, b, linkA, linkB, peerB, ma, mb } = ofiRailPair(provider, (p) => [p.addLink(handler), p.addLink({ onOp: () => {}, onRx: () => {} })]);
  new Uint8Array(ma.buffer, 0, 64).fill(0xaa);
  port.submitOfi(b.thread, b.lane, linkB, 1, SubKind.OFI_RECV, ...split(mb.addr), 64, mb.mr, 0, 0, 0, 0, 0, -1);
  port.flush();
  await sleep(100);
  port.submitOfi(a.thread, a.lane, linkA, 10, SubKind.OFI_SEND, ...split(ma.addr), 64, ma.mr, peerB, 0, 0, 0, 0, -1);
  port.flush();
  for (let i = 0; i < 100 && !status.has(10); i++) await sleep(10), port.poll();
  ofi.ioClose(b.lane, false);
  // Through A's I/O thread (a send with a completion), then from this thread (an inject).
  port.submitOfi(a.thread, a.lane, linkA, 11, SubKind.OFI_SEND, ...split(ma.addr), 64, ma.mr, peerB, 0, 0, 0, 0, 0x28005);
  port.submitOfiNow(a.thread, a.lane, linkA, 12, SubKind.OFI_SEND, ...split(ma.addr), 0, ma.mr, peerB, 0, 0, 0, 0, 0x28005);
  port.flush();
  for (let i = 0; i < 200 && !(status.has(11) && status.has(12)); i++) await sleep(10), port.poll();
  console.log(JSON.stringify({ before: status.get(10) ?? null, after: [status.get(11) ?? null, status.get(12) ?? null] }));
  forgetShm();
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi local: ${(err as Error).stack}`);
  process.exit(1);
});
