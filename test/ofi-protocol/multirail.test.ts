// Multi-rail: one device spread over several NICs. Large messages striped over rails (one
// stripe per rail, each written with that rail's key), small ones whole and round-robin,
// control messages on rail 0 or round-robin, OFI_NCCL_FORCE_NUM_RAILS subsetting or repeating
// NICs, and two ends with different NIC counts.
import { split } from '../support/addr';
import { describe, expect, it } from 'vitest';
import { immSegs } from '../../plugin/transports/ofi/wire';
import type { FakeHost } from './fake-fabric';
import { World, buf, expectBytes, pattern } from './harness';

const KiB = 1024;

/** Data writes (not control messages) each NIC of host posted: lengths, per NIC. */
function dataWrites(h: FakeHost, from = 0): number[][] {
  return h.rails.map((r) => r.log.slice(from).filter((o) => o.type === 'write' && o.imm >= 0 && immSegs(o.imm) !== 0).map((o) => o.len));
}

function ctrlWrites(h: FakeHost): number[] {
  return h.rails.map((r) => r.log.filter((o) => o.type === 'write' && o.imm >= 0 && immSegs(o.imm) === 0).length);
}

function setup(opts: ConstructorParameters<typeof World>[0]) {
  const w = new World(opts);
  const { send, recv } = w.connect();
  const src = w.a.region(4 << 20);
  src.bytes!.set(pattern(1, 4 << 20));
  const dst = w.b.region(4 << 20);
  let slot = 0;
  const one = (size: number) => {
    const s = ++slot;
    recv.irecv(s, [buf(dst, 0, 4 << 20, 0)]);
    w.settle(); // the control message is there: the send is written
    send.isend(s, buf(src, 0, size, 0));
    w.run(() => w.a.has(s) && w.b.has(s));
    expect(w.b.take(s).sizes).toEqual([size]);
    expectBytes(w.fabric.bytesOf(dst), 0, src.bytes!.subarray(0, size));
  };
  return { w, send, recv, src, dst, one };
}

describe('multi-rail', () => {
  it('stripes a large message over 4 rails, one stripe each', () => {
    const { w, one } = setup({ nicsA: 4 });
    one(1 << 20);
    expect(dataWrites(w.a.host)).toEqual([[262144], [262144], [262144], [262144]]);
    // every stripe names the same receive and says 4 segments
    for (const r of w.a.host.rails) expect(r.log.filter((o) => o.type === 'write' && o.len === 262144).map((o) => immSegs(o.imm))).toEqual([4]);
  });

  it('uses a divisor of the rails for mid-size messages, starting where the last one ended', () => {
    const { w, one } = setup({ nicsA: 4 });
    one(200 * KiB); // 2 stripes: rails 0, 1
    one(200 * KiB); // rails 2, 3
    one(3 * 128 * KiB); // 3 would be right, 2 divides 4: rails 0, 1
    expect(dataWrites(w.a.host)).toEqual([[102400, 196608], [102400, 196608], [102400], [102400]]);
  });

  it('sends small messages whole, round-robin over the rails', () => {
    const { w, one } = setup({ nicsA: 4, config: { eagerMax: -1 } });
    for (let i = 0; i < 8; i++) one(10 + i);
    expect(dataWrites(w.a.host)).toEqual([
      [10, 14],
      [11, 15],
      [12, 16],
      [13, 17],
    ]);
  });

  it('spreads eager messages round-robin too', () => {
    const w = new World({ nicsA: 3 });
    const { send, recv } = w.connect();
    const src = w.a.region(KiB);
    const dst = w.b.region(KiB);
    for (let i = 0; i < 6; i++) send.isend(i, buf(src, 0, 10 + i, 0));
    for (let i = 0; i < 6; i++) recv.irecv(i, [buf(dst, 0, 100, 0)]);
    w.run(() => w.a.done.size === 6 && w.b.done.size === 6);
    const eager = w.a.host.rails.map((r) => r.log.filter((o) => o.type === 'send' && o.len < 100).map((o) => o.len - 8));
    expect(eager).toEqual([
      [10, 13],
      [11, 14],
      [12, 15],
    ]);
  });

  it('puts control messages on rail 0, or round-robin with OFI_NCCL_RR_CTRL_MSG', () => {
    for (const rrCtrl of [false, true]) {
      const { w, one } = setup({ nicsA: 2, config: { rrCtrl } });
      for (let i = 0; i < 4; i++) one(100 * KiB);
      expect(ctrlWrites(w.b.host)).toEqual(rrCtrl ? [2, 2] : [4, 0]);
    }
  });

  it('TSNET_OFI_SMALL_RAIL=comm: small, eager and control messages and single-stripe ones up to the eager limit on the comm\'s home rail', () => {
    const { w, send, recv, src, dst, one } = setup({ nicsA: 4, nicsB: 4, config: { smallRail: 'comm' } });
    const home = send.id % 4;
    expect(recv.peerComm).toBe(send.id); // the receiver computes the same home rail
    for (let i = 0; i < 3; i++) one(10 + i); // written whole (the receive came first)
    one(8 * KiB); // written, one stripe, up to the eager limit
    one(100 * KiB); // written, one stripe, longer: the first of the rails' turns
    one(1 << 20); // written, 4 stripes, from the next rail on
    const writes = dataWrites(w.a.host);
    for (let r = 0; r < 4; r++) expect(writes[r]).toEqual([...(r === home ? [10, 11, 12, 8192] : []), ...(r === 0 ? [102400] : []), 262144]);
    // eager: the sends come before their receives
    for (let i = 0; i < 3; i++) send.isend(100 + i, buf(src, 0, 20 + i, 0));
    for (let i = 0; i < 3; i++) recv.irecv(100 + i, [buf(dst, 0, 100, 0)]);
    w.run(() => [100, 101, 102].every((s) => w.a.has(s) && w.b.has(s)));
    const eager = w.a.host.rails.map((r) => r.log.filter((o) => o.type === 'send' && o.len < 100).map((o) => o.len - 8));
    expect(eager).toEqual([0, 1, 2, 3].map((r) => (r === home ? [20, 21, 22] : [])));
    expect(ctrlWrites(w.b.host)).toEqual([0, 1, 2, 3].map((r) => (r === home ? 9 : 0)));
    // A second comm pair gets the next id, so its home is the next rail.
    const two = w.connect();
    expect(two.send.id % 4).toBe((home + 1) % 4);
  });

  it('OFI_NCCL_FORCE_NUM_RAILS=2 uses 2 of 4 NICs', () => {
    const { w, one } = setup({ nicsA: 4, config: { forceRails: 2 } });
    one(1 << 20);
    one(10);
    one(11);
    expect(dataWrites(w.a.host)).toEqual([[524288, 10], [524288, 11], [], []]);
  });

  it('OFI_NCCL_FORCE_NUM_RAILS=3 repeats the one NIC', () => {
    const { w, one } = setup({ nicsA: 1, config: { forceRails: 3 } });
    one(3 * 128 * KiB);
    expect(dataWrites(w.a.host)).toEqual([[131072, 131072, 131072]]);
    expect(w.a.ep.railCount).toBe(3);
  });

  it('two ends with 3 and 2 NICs use 2 rails', () => {
    const { w, one } = setup({ nicsA: 3, nicsB: 2 });
    one(1 << 20);
    expect(dataWrites(w.a.host)).toEqual([[524288], [524288], []]);
  });

  it('each stripe uses its rail key: a key of another NIC would be refused', () => {
    // The fake gives every NIC its own keys and refuses a write with another NIC's key; the
    // striped transfers above succeeding on 4 NICs show each stripe carried its rail's key.
    const w = new World({ nicsA: 2 });
    const src = w.a.region(4096);
    const dst = w.b.region(4096);
    const r0 = w.a.host.rails[0];
    const peer = r0.insertPeer(w.b.host.rails[0].name);
    const other = dst.regs[1];
    r0.write(peer, ...split(src.base), 64, src.regs[0].desc, ...split(dst.base), other.keyLo, other.keyHi, -1, 12345);
    w.fabric.step();
    expect(r0.cq[0]).toMatchObject({ token: 12345, status: -13 });
    expect(r0.cq[0].error).toMatch(/Remote access error/);
  });
});
