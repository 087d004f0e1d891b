// A libfabric lane whose close gives up on its I/O thread, stuck inside a poll with the lane's
// lock held (ioTestStall with a lane) after that poll took completions; when the poll returns,
// the thread must report none of them, post and poll nothing more, and close the endpoint
// itself (ofi-close.test.ts runs this in a child). Rail B posts 4 receives of 64 bytes; its
// thread is held while rail A sends 4 messages, then its poll takes them and hangs for STALL
// ms; ioClose(B) gives up meanwhile, B's memory is "given back" (overwritten), and after the
// stall the completions B's link got, and whether that memory was written, are printed; and
// how the count of abandoned endpoints (ofiAwaitAbandoned) and shm's regions went.
import { split } from '../support/addr';
import * as fs from 'node:fs';
import { SubKind } from '../../plugin/engine/records';
import { forgetShm, ofiRailPair } from './ofi-pair';

const provider = process.argv[2] || 'tcp';
const STALL = 1500;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
// shm's regions of this process in /dev/shm ("<pid>:<uid>:<index>"); tcp makes none. Not those
// an earlier process with this pid left before this one opened an endpoint, while untouched
// (same inode and change time: one shm took over counts); test/driver/shim.h says why.
const ownNames = () => fs.readdirSync('/dev/shm').filter((f) => f.startsWith(`${process.pid}:`));
const stamp = (f: string) => {
  const st = fs.statSync(`/dev/shm/${f}`, { throwIfNoEntry: false });
  return st ? `${st.ino}:${st.ctimeMs}` : '';
};
const stale = new Map(ownNames().map((f) => [f, stamp(f)]));
const regionsOfThisPid = () => ownNames().filter((f) => stale.get(f) !== stamp(f)).length;

async function main(): Promise<void> {
  const got = { a: 0, b: 0 };
  const handler = (k: 'a' | 'b') => ({ onOp: () => void got[k]++, onRx: () => {} });
  const { ofi, port, a, b, linkA, linkB, peerB, ma, mb } = ofiRailPair(provider, (p) => [p.addLink(handler('a')), p.addLink(handler('b'))]);
  const bBytes = new Uint8Array(mb.buffer, 0, 256);
  new Uint8Array(ma.buffer, 0, 256).fill(0xaa);
  let op = 100;
  for (let i = 0; i < 4; i++) port.submitOfi(b.thread, b.lane, linkB, op++, SubKind.OFI_RECV, ...split(mb.addr + 64 * i), 64, mb.mr, 0, 0, 0, 0, 0, -1);
  port.flush();
  await sleep(200);
  // B's thread is held (polling nothing) while A's messages come, then its next poll of B takes
  // their completions and hangs there with the lock held.
  ofi.ioTestStall(b.thread, 600);
  ofi.ioTestStall(b.thread, STALL, b.lane);
  await sleep(100);
  for (let i = 0; i < 4; i++) port.submitOfi(a.thread, a.lane, linkA, op++, SubKind.OFI_SEND, ...split(ma.addr + 64 * i), 64, ma.mr, peerB, 0, 0, 0, 0, -1);
  port.flush();
  await sleep(800);
  port.poll();
  const before = got.b;
  const t0 = performance.now();
  const closed = ofi.ioClose(b.lane, false);
  const closeMs = Math.round(performance.now() - t0);
  bBytes.fill(0x55); // given back: whatever the endpoint does from now on must not show here
  // What the last finalize does (transport.ts, abandonedLines): B's endpoint is counted as
  // abandoned until its thread, back from the stall, closes it; the wait ends then.
  const abandoned = ofi.ofiAwaitAbandoned(0);
  const regionsAbandoned = regionsOfThisPid();
  const t1 = performance.now();
  const abandonedLeft = ofi.ofiAwaitAbandoned(STALL + 5000);
  const awaitMs = Math.round(performance.now() - t1);
  const regionsAfter = regionsOfThisPid();
  await sleep(500);
  port.poll();
  const intact = bBytes.every((x) => x === 0x55);
  console.log(
    JSON.stringify({
      closeMs, closed, completionsBefore: before, completionsAfterClose: got.b - before, sendsDone: got.a, intact,
      abandoned, abandonedLeft, awaitMs, regionsAbandoned, regionsAfter,
    }),
  );
  forgetShm();
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi abandon: ${(err as Error).stack}`);
  process.exit(1);
});
