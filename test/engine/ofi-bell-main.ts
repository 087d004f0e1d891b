// Doorbells (ofi-bell.test.ts runs this in a child): rail B's I/O thread sleeps with only a
// receive posted, armed, after a gap of 60 ms; rail A sends to it, in turn through its I/O
// thread (a send with a completion) and as an inject from this thread. Each send after a gap
// must ring B's bell once, and B must hear each ring. Bells left by processes that are gone
// (one's owner a pid that cannot exist, the other's this pid with another start time) are
// swept away when this process makes its first.
// argv: provider, bell (1 or 0). Prints {"bell": [A's, B's], "rang", "heard", "got":
// [statuses], "files": [this process's bell pages while open, after B's close], "stale": a
// left bell still there} and exits 0.
import { split } from '../support/addr';
import * as fs from 'fs';
import { SubKind } from '../../plugin/engine/records';
import { forgetShm, ofiRailPair } from './ofi-pair';

const provider = process.argv[2] || 'shm';
const bell = process.argv[3] !== '0';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
type LaneState = { bell?: boolean; bellRang?: number; bellHeard?: number };

/** This process's bell pages in /dev/shm (the owner's pid is the page's third word), the stale ones made below aside. */
function bellFiles(): string[] {
  return fs.readdirSync('/dev/shm').filter((f) => {
    if (!f.startsWith('tsnet-bell-') || f.endsWith('.s') || f.startsWith('tsnet-bell-00000000deadbee')) return false;
    try {
      const b = fs.readFileSync(`/dev/shm/${f}`);
      return b.length >= 12 && b.readInt32LE(8) === process.pid;
    } catch {
      return false;
    }
  });
}

async function main(): Promise<void> {
  // Left by a process that is gone, and by an earlier process with this very pid (its start
  // time is not this process's).
  const stales = ['/dev/shm/tsnet-bell-00000000deadbee5', '/dev/shm/tsnet-bell-00000000deadbee6'];
  stales.forEach((f, i) => {
    const page = Buffer.alloc(4096);
    page.writeUInt32LE(0x6c6c6562, 0);
    page.writeUInt32LE(1, 4);
    page.writeInt32LE(i === 0 ? 0x7fffffff : process.pid, 8); // above any pid_max; this pid
    page.writeBigUInt64LE(1n, 24); // started 1 tick after boot
    fs.writeFileSync(f, page);
    fs.writeFileSync(`${f}.s`, '');
  });
  const status = new Map<number, number>();
  const handler = { onOp: (op: number, st: number) => void status.set(op, st), onRx: () => {} };
  const { ofi, port, a, b, linkA, linkB, peerB, ma, mb } = ofiRailPair(
    provider,
    (p) => [p.addLink({ onOp: () => {}, onRx: () => {} }), p.addLink(handler)],
    { bell },
  );
  const state = (lane: number) => (ofi as unknown as { ioLaneState(lane: number): LaneState }).ioLaneState(lane);
  new Uint8Array(ma.buffer, 0, 64).fill(0xbb);
  const got: number[] = [];
  for (let round = 0; round < 4; round++) {
    const recv = 100 + round;
    port.submitOfi(b.thread, b.lane, linkB, recv, SubKind.OFI_RECV, ...split(mb.addr), 64, mb.mr, 0, 0, 0, 0, 0, -1);
    port.flush();
    await sleep(60); // B's thread has slept since, its bell armed
    if (round % 2 === 0) port.submitOfi(a.thread, a.lane, linkA, 200 + round, SubKind.OFI_SEND, ...split(ma.addr), 64, ma.mr, peerB, 0, 0, 0, 0, -1);
    else port.submitOfiNow(a.thread, a.lane, linkA, 200 + round, SubKind.OFI_SEND, ...split(ma.addr), 64, ma.mr, peerB, 0, 0, 0, 0, -1);
    port.flush();
    for (let i = 0; i < 500 && !status.has(recv); i++) await sleep(2), port.poll();
    got.push(status.get(recv) ?? -1);
  }
  const sa = state(a.lane);
  const sb = state(b.lane);
  const open = bellFiles().length;
  ofi.ioClose(b.lane, false);
  await sleep(100);
  const left = stales.some((f) => fs.existsSync(f) || fs.existsSync(`${f}.s`));
  for (const f of stales) for (const g of [f, `${f}.s`]) fs.rmSync(g, { force: true });
  console.log(JSON.stringify({ bell: [sa.bell, sb.bell], rang: sa.bellRang, heard: sb.bellHeard, got, files: [open, bellFiles().length], stale: left }));
  forgetShm();
  process.exit(0);
}

main().catch((err) => {
  console.error(`ofi bell: ${(err as Error).stack}`);
  process.exit(1);
});
