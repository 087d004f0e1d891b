// The liveness clock of a NativeLink (plugin/engine/native-link.ts) through its Port, over a
// fake engine binding (rings in plain ArrayBuffers, completions written by hand): when the
// peer was last heard from and when this side last wrote, as the watchdog (Endpoint.tick)
// reads them. The real engine's rings are tested in test/engine/.
import { afterEach, describe, expect, it } from 'vitest';
import { ResultCode } from '../../plugin/abi';
import { monoMs, setClock } from '../../plugin/clock';
import type { LaneBinding } from '../../plugin/engine/native-link';
import { NativeLink } from '../../plugin/engine/native-link';
import { Port } from '../../plugin/engine/port';
import { CQE, CQE_RX, RING, RX, SUB } from '../../plugin/engine/records';
import { FrameType, encodeFrame } from '../../plugin/protocol/frames';
import { recvRingBytes } from '../../plugin/protocol/link';
import { Receiver, newRecvArgs } from '../../plugin/protocol/receiver';
import { type Completion, ringBuffer as makeRing, policyOf, testClock } from './helpers';

const RECORDS = 64;

const ringBuffer = (recordBytes: number) => makeRing(RECORDS, recordBytes);

/** An engine with one I/O thread whose rings are ArrayBuffers the test reads and writes. */
class FakeEngine implements LaneBinding {
  readonly sub = ringBuffer(SUB.bytes);
  readonly cq = ringBuffer(CQE.bytes);
  readonly rxs: ArrayBuffer[] = [];
  private lanes = 0;

  ioStart(): number {
    return 1;
  }
  ioPort() {
    return { sub: [this.sub], cq: [this.cq], sleeping: new Int32Array(1), port: 0 };
  }
  ioWake(): void {}
  ioAdopt(_fd: number, _thread: number, _link: number, rxBytes: number) {
    const lane = this.lanes++;
    if (!rxBytes) return { lane, thread: 0 };
    const rx = new ArrayBuffer(RX.bytes + rxBytes);
    new Uint32Array(rx, 0, RX.bytes / 4)[RX.capacity / 4] = rxBytes;
    this.rxs.push(rx);
    return { lane, thread: 0, rx };
  }
  ioClose() {
    return { partial: false, hard: false };
  }
  ioCancel() {
    return { reads: 0, writes: 0 };
  }
  ioLaneState(lane: number) {
    return { lane, thread: 0, sleepFlag: 0, wakeCount: 0, passes: 0, inCall: false, listed: false, hup: false, locked: false };
  }
  /** Frames written here: every one goes whole (a completion time of 0), when set. */
  writeNowAll = false;
  ioWriteNow(): number {
    return this.writeNowAll ? 0 : -1;
  }

  /** The I/O thread's completion: op of link with status and value. */
  complete(link: number, op: number, status = 0, value = 0): void {
    const hdr = new Uint32Array(this.cq, 0, RING.bytes / 4);
    const tail = Atomics.load(hdr, RING.tail / 4);
    const b = RING.bytes + (tail & (RECORDS - 1)) * CQE.bytes;
    new Uint32Array(this.cq)[(b + CQE.link) / 4] = link;
    new Uint32Array(this.cq)[(b + CQE.op) / 4] = op;
    new Int32Array(this.cq)[(b + CQE.status) / 4] = status;
    new Float64Array(this.cq)[(b + CQE.value) / 8] = value;
    Atomics.store(hdr, RING.tail / 4, (tail + 1) >>> 0);
  }

  /** Bytes arriving on a control lane: appended to its receive ring, then its notification. */
  receive(rx: ArrayBuffer, link: number, bytes: Uint8Array): void {
    const hdr = new Uint32Array(rx, 0, RX.bytes / 4);
    const cap = hdr[RX.capacity / 4];
    const ring = new Uint8Array(rx, RX.bytes, cap);
    const w = Atomics.load(hdr, RX.written / 4);
    for (let i = 0; i < bytes.length; i++) ring[(w + i) & (cap - 1)] = bytes[i];
    Atomics.store(hdr, RX.written / 4, (w + bytes.length) >>> 0);
    this.complete(link, CQE_RX, 0, w + bytes.length);
  }
}

/** The link id the port gave: its first link is 1. */
const FIRST_LINK = 1;

describe('NativeLink liveness clock', () => {
  afterEach(() => setClock(undefined));

  it('a new link was heard from and wrote at its birth, even when the port last polled long ago', () => {
    const clock = testClock();
    const t0 = monoMs();
    const engine = new FakeEngine();
    const port = new Port(engine);
    port.poll();
    clock.set(t0 + 60_000); // the protocol thread sat idle for a minute
    const link = new NativeLink(port, engine, [10, 11], policyOf({ lanes: 1 }), 'test', 1 << 16);
    expect(link.heard).toBe(t0 + 60_000);
    expect(link.wrote).toBe(t0 + 60_000);
  });

  it('heard moves with every completion the port hands the link; wrote with every write of a turn', () => {
    const clock = testClock();
    const t0 = monoMs();
    const engine = new FakeEngine();
    const port = new Port(engine);
    const link = new NativeLink(port, engine, [10, 11], policyOf({ lanes: 1 }), 'test', 1 << 16);
    link.attach({ onOp: () => {}, onRx: () => {} });
    for (const at of [5_000, 20_000, 45_000]) {
      clock.set(t0 + at);
      engine.complete(FIRST_LINK, 7);
      port.poll(); // a turn
      expect(link.heard).toBe(t0 + at);
      link.write(0, 0, 0x1000, 10, 8);
      link.frame(FrameType.HEARTBEAT, 0, 0, -1, 0, 0, 0, 0, -1);
      expect(link.wrote).toBe(t0 + at);
    }
  });

  it('a frame this thread wrote itself is no word from the peer: heard stays, even when the port last polled long ago', () => {
    const clock = testClock();
    const t0 = monoMs();
    const engine = new FakeEngine();
    const port = new Port(engine);
    port.writeNowMax = 8192;
    engine.writeNowAll = true;
    port.poll();
    clock.set(t0 + 11_000); // nothing came for longer than the timeout (the C driver's stranger: 10 s)
    const link = new NativeLink(port, engine, [10, 11], policyOf({ lanes: 1 }), 'test', 1 << 16);
    const ops: number[] = [];
    link.attach({ onOp: (op) => ops.push(op), onRx: () => {} });
    clock.set(t0 + 11_500);
    link.frame(FrameType.MSG, 0, 0, 0, 1, 0, 0x1000, 1, 5); // a small message, written during the turn
    port.poll(); // its completion, from this thread
    expect(ops).toEqual([5]);
    expect(link.heard).toBe(t0 + 11_000); // its birth, not the port's last poll (t0)
    // The peer's word (a completion from the I/O thread) still counts.
    clock.set(t0 + 12_000);
    engine.complete(FIRST_LINK, 7);
    port.poll();
    expect(link.heard).toBe(t0 + 12_000);
  });

  it('a receiver whose peer keeps sending heartbeats stays up with a receive pending for longer than the timeout', () => {
    const clock = testClock();
    const t0 = monoMs();
    const TIMEOUT = 10_000;
    const engine = new FakeEngine();
    const port = new Port(engine);
    const link = new NativeLink(port, engine, [10, 11], policyOf({ lanes: 1 }), 'test', recvRingBytes(64 * 1024));
    const got: Completion[] = [];
    const receiver = new Receiver(link, (slot, code, sizes, n) => got.push({ slot, code, sizes: Array.from(sizes).slice(0, n) }), 'test-recv');
    receiver.start();
    const args = newRecvArgs();
    args.n = 1;
    receiver.irecv(0, args);
    const heartbeat = encodeFrame({ type: FrameType.HEARTBEAT, flags: 0, tag: 0, seq: -1, size: 0 });
    for (let at = 2_000; at <= 6 * TIMEOUT; at += 2_000) {
      clock.set(t0 + at);
      engine.receive(engine.rxs[0], FIRST_LINK, heartbeat);
      port.poll(); // the turn that hands the notification over
      receiver.tick(monoMs(), TIMEOUT); // the watchdog
    }
    expect(got).toEqual([]);
    // Once the peer falls silent for the timeout, the receive fails.
    clock.set(t0 + 7 * TIMEOUT + 1);
    receiver.tick(monoMs(), TIMEOUT);
    expect(got).toEqual([{ slot: 0, code: ResultCode.REMOTE_ERROR, sizes: [0] }]);
  });
});
