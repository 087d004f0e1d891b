// Port.submitOfiNow (plugin/engine/port.ts) over a fake engine binding: when the protocol thread
// asks the engine to post a libfabric send or write itself (ioWriteNow), what the record holds
// then, where the completion comes from, and when the record goes through the ring instead
// (over the limit, a record waiting in the ring, the turn's allowance per lane, the engine's
// refusal). What the engine does with it (an inject, engine_ofi.cc) runs under the C driver
// over real libfabric (test/driver/ofi.test.ts).
import { ADDR_SPLIT } from '../../plugin/addr';
import { split } from '../support/addr';
import { describe, expect, it } from 'vitest';
import { type CqeHandler, Port } from '../../plugin/engine/port';
import { CQE, RING, SUB, SUB_F_IMM, SubKind } from '../../plugin/engine/records';
import { ringBuffer as makeRing } from './helpers';

const RECORDS = 64;

const ringBuffer = (recordBytes: number) => makeRing(RECORDS, recordBytes);

interface Seen {
  lane: number;
  op: number;
  kind: number;
  addr: number;
  len: number;
  raddr: number;
  keyLo: number;
  keyHi: number;
  imm: number;
  flags: number;
  peer: number;
  mr: number;
  immHi: number;
}

/** One I/O thread; ioWriteNow answers `answer` and keeps what the record held. */
class FakeEngine {
  readonly sub = ringBuffer(SUB.bytes);
  readonly cq = ringBuffer(CQE.bytes);
  answer = 123.5; // a completion time: posted here
  readonly calls: Seen[] = [];

  ioStart(): number {
    return 1;
  }
  ioPort() {
    return { sub: [this.sub], cq: [this.cq], sleeping: new Int32Array(1), port: 0 };
  }
  ioWake(): void {}
  ioWriteNow(thread: number, index: number): number {
    expect(thread).toBe(0);
    const b = RING.bytes + (index & (RECORDS - 1)) * SUB.bytes;
    const u32 = new Uint32Array(this.sub);
    const f64 = new Float64Array(this.sub);
    this.calls.push({
      lane: u32[(b + SUB.lane) / 4],
      op: u32[(b + SUB.op) / 4],
      kind: new Uint16Array(this.sub)[(b + SUB.kind) / 2],
      addr: f64[(b + SUB.addr) / 8],
      len: f64[(b + SUB.len) / 8],
      raddr: f64[(b + SUB.raddr) / 8],
      keyLo: u32[(b + SUB.rkeyLo) / 4],
      keyHi: u32[(b + SUB.rkeyHi) / 4],
      imm: u32[(b + SUB.imm) / 4],
      flags: u32[(b + SUB.flags) / 4],
      peer: u32[(b + SUB.aux) / 4],
      mr: u32[(b + SUB.mr) / 4],
      immHi: u32[(b + SUB.inl) / 4],
    });
    return this.answer;
  }

  /** Records published to the I/O thread so far (the ring's tail). */
  published(): number {
    return Atomics.load(new Uint32Array(this.sub, 0, RING.bytes / 4), RING.tail / 4);
  }

  /** The I/O thread takes every published record. */
  take(): void {
    const hdr = new Uint32Array(this.sub, 0, RING.bytes / 4);
    Atomics.store(hdr, RING.head / 4, Atomics.load(hdr, RING.tail / 4));
  }
}

function setup(max = 8192) {
  const e = new FakeEngine();
  const port = new Port(e);
  port.writeNowMax = max;
  const done: { op: number; status: number; value: number; time: number; io: number }[] = [];
  const h: CqeHandler = {
    onOp: (op, status, value, time, io) => done.push({ op, status, value, time, io }),
    onRx: () => {},
  };
  const link = port.addLink(h);
  return { e, port, link, done };
}

// A send of len bytes from registration 7 to peer 3 with immediate data 0x55, after an 8-byte header.
const send = (p: Port, link: number, lane: number, op: number, len: number) =>
  p.submitOfiNow(0, lane, link, op, SubKind.OFI_SEND, ...split(0x10000), len, 7, 3, ...split(0x20000), 8, 9, 0x55);

describe('Port.submitOfiNow', () => {
  it('a small send on an idle ring: the engine gets the whole record at once, nothing is published, the completion (io -1, payload bytes) comes from the next poll', () => {
    const { e, port, link, done } = setup();
    send(port, link, 5, 41, 100);
    expect(e.calls).toEqual([{ lane: 5, op: 41, kind: SubKind.OFI_SEND, addr: 0x10000, len: 100, raddr: 0x20000, keyLo: 8, keyHi: 9, imm: 0x55, flags: SUB_F_IMM, peer: 3, mr: 7, immHi: 0 }]);
    expect(done).toEqual([]);
    expect(port.poll()).toBe(1);
    expect(done).toEqual([{ op: 41, status: 0, value: 100, time: 123.5, io: -1 }]);
    port.flush();
    expect(e.published()).toBe(0);
    expect(port.writtenHere).toBe(1);
  });

  it('a write with immediate data goes too, its high half along; the limit counts a send\'s header', () => {
    const { e, port, link } = setup(108);
    port.submitOfiNow(0, 2, link, 1, SubKind.OFI_WRITE, ...split(0x3000), 108, 4, 1, ...split(0x9000), 11, 12, 0x77, 0xabc);
    expect(e.calls.map((c) => [c.kind, c.len, c.imm, c.immHi, c.keyLo, c.keyHi])).toEqual([[SubKind.OFI_WRITE, 108, 0x77, 0xabc, 11, 12]]);
    port.flush();
    send(port, link, 3, 2, 100); // 8 + 100 bytes: at the limit
    port.flush();
    send(port, link, 4, 3, 101); // 8 + 101: over it
    port.flush();
    expect(e.calls.map((c) => c.op)).toEqual([1, 2]);
    expect(e.published()).toBe(1);
  });

  it('refused by the engine: the record is published as it is, and its completion is the I/O thread\'s', () => {
    const { e, port, link, done } = setup();
    e.answer = -1;
    send(port, link, 5, 41, 100);
    port.flush();
    expect(e.calls.length).toBe(1);
    expect(e.published()).toBe(1);
    expect(port.poll()).toBe(0);
    expect(done).toEqual([]);
    expect(port.writtenHere).toBe(0);
  });

  it('two of a lane per turn go here; the third, and everything after it in the turn (another lane\'s too), through the ring in order; the next turn, here again', () => {
    const { e, port, link } = setup();
    send(port, link, 5, 1, 8);
    send(port, link, 5, 2, 8);
    send(port, link, 5, 3, 8); // third of lane 5
    send(port, link, 6, 4, 8); // behind a record in the ring
    port.flush();
    expect(e.calls.map((c) => c.op)).toEqual([1, 2]);
    expect(e.published()).toBe(2);
    e.take();
    send(port, link, 5, 5, 8);
    port.flush();
    expect(e.calls.map((c) => c.op)).toEqual([1, 2, 5]);
  });

  it('a published record the I/O thread has not taken yet keeps later ones behind it', () => {
    const { e, port, link } = setup();
    e.answer = -1;
    send(port, link, 5, 1, 8);
    port.flush();
    e.answer = 0;
    send(port, link, 6, 2, 8); // the I/O thread has not taken op 1
    port.flush();
    expect(e.calls.map((c) => c.op)).toEqual([1]);
    expect(e.published()).toBe(2);
    e.take();
    send(port, link, 6, 3, 8);
    expect(e.calls.map((c) => c.op)).toEqual([1, 3]);
  });

  it('TSNET_DIRECT_SEND_MAX -1 (writeNowMax -1): never, not even 0 bytes', () => {
    const { e, port, link } = setup(-1);
    port.submitOfiNow(0, 5, link, 1, SubKind.OFI_SEND, ...split(0x10000), 0, 7, 3, 0, 0, 0, 0, 0x55);
    port.flush();
    expect(e.calls).toEqual([]);
    expect(e.published()).toBe(1);
  });
});

describe('Port.submitOfiRecv', () => {
  /** Record i of the submission ring, as the I/O thread reads it. */
  const record = (e: FakeEngine, i: number): number[] => {
    const b = RING.bytes + (i & (RECORDS - 1)) * SUB.bytes;
    return Array.from(new Uint8Array(e.sub, b, SUB.bytes));
  };

  it('writes the record submitOfi writes for a receive, for addresses up to 2^47 passed as two small integers', () => {
    const { e, port, link } = setup();
    const addrs = [0x1000, 0x7fff_f000_1234, 2 ** 47 - 64, 0x5555_5555_5550];
    for (const [k, a] of addrs.entries()) {
      const hi = Math.floor(a / ADDR_SPLIT);
      port.submitOfiRecv(0, 3, link, 100 + k, hi, a - hi * ADDR_SPLIT, 8256, 9);
      port.submitOfi(0, 3, link, 100 + k, SubKind.OFI_RECV, ...split(a), 8256, 9, 0, 0, 0, 0, 0, -1);
    }
    port.flush();
    expect(e.published()).toBe(2 * addrs.length);
    for (let k = 0; k < addrs.length; k++) {
      expect(record(e, 2 * k), `address 0x${addrs[k].toString(16)}`).toEqual(record(e, 2 * k + 1));
      expect(new Float64Array(e.sub, RING.bytes + 2 * k * SUB.bytes + SUB.addr, 1)[0]).toBe(addrs[k]);
    }
  });

  it('with the ring full, queues behind what waits, in order, as submitOfi does', () => {
    const { e, port, link } = setup();
    for (let i = 0; i < RECORDS; i++) port.submitOfi(0, 1, link, i, SubKind.OFI_RECV, ...split(0x2000), 64, 1, 0, 0, 0, 0, 0, -1);
    port.submitOfiRecv(0, 1, link, 500, 3, 0x10, 64, 1); // no room: queued
    port.flush();
    expect(e.published()).toBe(RECORDS);
    e.take();
    port.flush();
    expect(e.published()).toBe(RECORDS + 1);
    const f64 = new Float64Array(e.sub, RING.bytes + (RECORDS & (RECORDS - 1)) * SUB.bytes, SUB.bytes / 8);
    expect(f64[SUB.addr / 8]).toBe(3 * ADDR_SPLIT + 0x10);
    expect(new Uint32Array(e.sub, RING.bytes + (RECORDS & (RECORDS - 1)) * SUB.bytes, SUB.bytes / 4)[SUB.op / 4]).toBe(500);
  });
});
