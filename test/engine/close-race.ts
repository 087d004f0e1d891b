// Lanes closed from both ends at random moments, gracefully or not, with writes (external and
// inline) and reads in flight: the close races the I/O threads, which may see the peer's end and
// finish a graceful close before they take the protocol thread's kick. Shared by
// close-race.test.ts (in process) and close-race-main.ts (a child under AddressSanitizer).
import { split } from '../support/addr';
import * as fs from 'fs';
import type { Port } from '../../plugin/engine/port';
import { SUB_F_NOCQE, SubKind } from '../../plugin/engine/records';
import { FrameType } from '../../plugin/protocol/frames';
import { type EngineAddon, MiB, Mem, prng, turn, until } from './helpers';

export interface RaceResult {
  cycles: number;
  lanes: number;
  graceful: number;
  hard: number;
}

/**
 * cycles rounds of 1-3 socketpairs (the first with receive rings, as a control lane) on
 * ioThreads I/O threads; each round submits up to 20 random operations, then closes all
 * lanes in a random order, turning the event loop now and then. Ends with one more pair that
 * must carry 1 MiB (the I/O threads still work) and with every lane freed.
 */
export async function closeRace(a: EngineAddon, port: Port, ioThreads: number, cycles: number, seed: number): Promise<RaceResult> {
  const rnd = prng(seed);
  const mems = [new Mem(4 * MiB), new Mem(4 * MiB), new Mem(4 * MiB)];
  const sink = { onOp() {}, onRx() {} };
  const base = a.lanes();
  const out: RaceResult = { cycles, lanes: 0, graceful: 0, hard: 0 };
  for (let c = 0; c < cycles; c++) {
    // ring: the control lane's receive ring. NativeLink holds it until the lane is closed; here
    // half of them are dropped at once, which must not free what the lane still writes into.
    const ends: { lane: number; thread: number; link: number; ctl: boolean; ring: ArrayBuffer | undefined }[] = [];
    const pairs = 1 + Math.floor(rnd() * 3);
    for (let p = 0; p < pairs; p++) {
      const fds = a.socketPair();
      for (const fd of fds) {
        const link = port.addLink(sink);
        const thread = Math.floor(rnd() * (ioThreads + 1)) - 1; // -1: the engine picks
        const r = a.ioAdopt(fd, thread, link, p === 0 ? 4096 : 0);
        fs.closeSync(fd);
        ends.push({ lane: r.lane, thread: r.thread, link, ctl: p === 0, ring: rnd() < 0.5 ? r.rx : undefined });
      }
    }
    out.lanes += ends.length;
    // Where the process runs with --expose-gc: now and then a collection (and a turn, when
    // finalizers run) while these lanes are open, so that the rings dropped go before the
    // traffic the lanes write into them.
    if (c % 5 === 0 && (globalThis as { gc?: () => void }).gc) {
      (globalThis as { gc?: () => void }).gc!();
      await turn();
    }
    const ops = Math.floor(rnd() * 20);
    for (let k = 0; k < ops; k++) {
      const e = ends[Math.floor(rnd() * ends.length)];
      const m = mems[Math.floor(rnd() * mems.length)];
      const len = Math.floor(rnd() * 2 * MiB);
      const kind = rnd();
      if (kind < 0.4) port.submit(e.thread, e.lane, e.link, k, SubKind.WRITE, 0, ...split(m.addr), len);
      else if (kind < 0.7) port.submit(e.thread, e.lane, e.link, k, SubKind.WRITE, SUB_F_NOCQE, 0, 0, 0, FrameType.HEARTBEAT, 0, k, k, 0);
      else if (!e.ctl) port.submit(e.thread, e.lane, e.link, k, SubKind.READ, 0, ...split(m.addr), len);
    }
    port.flush();
    for (const i of ends.map((_, i) => i).sort(() => rnd() - 0.5)) {
      const e = ends[i];
      if (rnd() < 0.3) await turn();
      port.poll();
      port.flush();
      const graceful = rnd() < 0.6;
      a.ioClose(e.lane, graceful);
      e.ring = undefined;
      out[graceful ? 'graceful' : 'hard']++;
      port.removeLink(e.link);
    }
    if (rnd() < 0.3) await turn();
    port.poll();
  }
  // The I/O threads still carry bytes.
  const fds = a.socketPair();
  const done = new Map<number, { status: number; value: number }>();
  const tx = port.addLink({ onOp: (op, status, value) => done.set(op, { status, value }), onRx() {} });
  const rx = port.addLink({ onOp: (op, status, value) => done.set(op, { status, value }), onRx() {} });
  const ta = a.ioAdopt(fds[0], -1, tx, 0);
  const tb = a.ioAdopt(fds[1], -1, rx, 0);
  fds.forEach((fd) => fs.closeSync(fd));
  const src = new Mem(MiB);
  const dst = new Mem(MiB);
  src.bytes.fill(7);
  port.submit(ta.thread, ta.lane, tx, 1, SubKind.WRITE, 0, ...split(src.addr), MiB);
  port.submit(tb.thread, tb.lane, rx, 2, SubKind.READ, 0, ...split(dst.addr), MiB);
  await until(() => done.size === 2, 10_000, '1 MiB over a new pair after the races', [port]);
  if (done.get(1)?.status !== 0 || done.get(2)?.status !== 0 || dst.bytes[MiB - 1] !== 7)
    throw new Error(`the pair after the races: ${JSON.stringify([...done])}`);
  a.ioClose(ta.lane, false);
  a.ioClose(tb.lane, false);
  port.removeLink(tx);
  port.removeLink(rx);
  // Every lane is freed (graceful ones once their peer's end came, or their linger ran out).
  await until(() => a.lanes() === base, 10_000, `every lane freed (${a.lanes() - base} left)`, [port]);
  return out;
}
