// The fake fabric itself: what the protocol tests rely on it to do like libfabric.
import { split } from '../support/addr';
import { describe, expect, it } from 'vitest';
import { BOUNCE_TOKEN } from '../../plugin/transports/ofi/bounce';
import { CqFlag } from '../../plugin/transports/ofi/fabric';
import { FakeFabric } from './fake-fabric';

function two(opts = {}) {
  const f = new FakeFabric({ seed: 5, ...opts });
  const a = f.host('a', 1).rails[0];
  const b = f.host('b', 1).rails[0];
  const peer = a.insertPeer(b.name);
  const src = a.alloc(4096);
  const dst = b.alloc(4096);
  src.bytes.set([1, 2, 3, 4]);
  return { f, a, b, peer, src, dst };
}

describe('fake fabric', () => {
  it('a send waits for a posted receive, then lands with its immediate data', () => {
    const { f, a, b, peer, src, dst } = two();
    a.send(peer, ...split(src.addr), 4, src.reg.desc, 77, 1);
    expect(f.step()).toBe(false); // blocked: nothing posted
    b.postRecv(dst, 100, 64, 0x8000_0005);
    f.run();
    expect(dst.bytes.subarray(100, 104)).toEqual(new Uint8Array([1, 2, 3, 4]));
    expect(f.ops).toEqual([]);
  });

  it('delivers completions to onCompletions in CQ order', () => {
    const { f, a, b, peer, src, dst } = two();
    const seen: number[] = [];
    b.onCompletions = (_r, batch) => batch.forEach((c) => seen.push(c.token));
    a.onCompletions = () => {};
    for (let i = 0; i < 5; i++) b.postRecv(dst, i * 8, 8, BOUNCE_TOKEN + i);
    for (let i = 0; i < 5; i++) a.send(peer, ...split(src.addr), 4, src.reg.desc, i, 10 + i);
    f.run();
    expect(seen).toEqual([0, 1, 2, 3, 4].map((i) => BOUNCE_TOKEN + i)); // receives are consumed in posting order
  });

  it('checks keys: unknown, another NIC, out of range', () => {
    const f = new FakeFabric({ seed: 1 });
    const a = f.host('a', 1).rails[0];
    const h = f.host('b', 2);
    const peer = a.insertPeer(h.rails[0].name);
    const src = a.alloc(4096);
    const dst = h.rails[0].alloc(4096);
    const other = h.rails[1].regMr(dst.addr, 4096, 'host');
    const errs: string[] = [];
    a.onCompletions = (_r, batch) => batch.forEach((c) => errs.push(`${c.status} ${c.error}`));
    a.write(peer, ...split(src.addr), 8, src.reg.desc, ...split(dst.addr), 0x1234, 0, -1, 1);
    a.write(peer, ...split(src.addr), 8, src.reg.desc, ...split(dst.addr), other.keyLo, other.keyHi, -1, 2);
    a.write(peer, ...split(src.addr), 8, src.reg.desc, ...split(dst.addr + 4090), dst.reg.keyLo, dst.reg.keyHi, -1, 3);
    a.read(peer, ...split(src.addr), 8, src.reg.desc, ...split(dst.addr), dst.reg.keyLo, dst.reg.keyHi, 4);
    f.run();
    expect(errs.filter((e) => e.startsWith('-13 Remote access error'))).toHaveLength(3);
    expect(errs).toContain('0 undefined');
  });

  it('with FI_RX_CQ_DATA a write with immediate data consumes a posted receive', () => {
    const { f, a, b, peer, src, dst } = two({ rxCqData: true });
    const got: { token: number; flags: number; imm: number; len: number }[] = [];
    b.onCompletions = (_r, batch) => batch.forEach((c) => got.push(c));
    a.onCompletions = () => {};
    a.write(peer, ...split(src.addr), 4, src.reg.desc, ...split(dst.addr), dst.reg.keyLo, dst.reg.keyHi, 9, 1);
    expect(f.step()).toBe(false);
    b.postRecv(dst, 0, 64, 0x8000_0001);
    f.run();
    expect(got).toMatchObject([{ token: 0x8000_0001, flags: CqFlag.REMOTE_WRITE | CqFlag.REMOTE_CQ_DATA, imm: 9, len: 4 }]);
  });

  it('offset-mode registrations take offsets as remote addresses', () => {
    const { f, a, peer, src, dst } = two({ virtAddr: false });
    expect(dst.addr + 10 + dst.reg.remoteDelta).toBe(10);
    a.write(peer, ...split(src.addr), 4, src.reg.desc, ...split(dst.addr + 10 + dst.reg.remoteDelta), dst.reg.keyLo, dst.reg.keyHi, -1, 1);
    f.run();
    expect(dst.bytes.subarray(10, 14)).toEqual(new Uint8Array([1, 2, 3, 4]));
  });

  it('a killed host: its operations vanish, operations to it fail with ECONNRESET', () => {
    const { f, a, b, peer, src } = two();
    const bp = b.insertPeer(a.name);
    const errs: number[] = [];
    a.onCompletions = (_r, batch) => batch.forEach((c) => errs.push(c.status));
    b.send(bp, 0, 0, 0, 0, -1, 1);
    f.kill(b.host);
    a.send(peer, ...split(src.addr), 4, src.reg.desc, -1, 2);
    f.run();
    expect(errs).toEqual([-104]);
    expect(f.ops).toEqual([]);
  });

  it('lagging writes into GPU memory become visible only with a read through that NIC', () => {
    const f = new FakeFabric({ seed: 2, lagWrites: 'until-read' });
    const a = f.host('a', 1).rails[0];
    const b = f.host('b', 1).rails[0];
    const peer = a.insertPeer(b.name);
    const self = b.insertPeer(b.name);
    const src = a.alloc(64);
    src.bytes.fill(7);
    const gpu = f.region(b.host, 64, 'cuda');
    const line = b.alloc(64);
    a.write(peer, ...split(src.addr), 64, src.reg.desc, ...split(gpu.base), gpu.regs[0].keyLo, gpu.regs[0].keyHi, 1, 1);
    f.run();
    expect(f.bytesOf(gpu).every((x) => x === 0)).toBe(true);
    b.read(self, ...split(line.addr), 4, line.reg.desc, ...split(gpu.base), gpu.regs[0].keyLo, gpu.regs[0].keyHi, 2);
    f.run();
    expect(f.bytesOf(gpu).every((x) => x === 7)).toBe(true);
    expect(line.bytes.subarray(0, 4)).toEqual(new Uint8Array([7, 7, 7, 7]));
  });

  it('truncates a message larger than the posted receive with an error at the receiver', () => {
    const { f, a, b, peer, src, dst } = two();
    const got: number[] = [];
    b.onCompletions = (_r, batch) => batch.forEach((c) => got.push(c.status));
    a.onCompletions = () => {};
    b.postRecv(dst, 0, 2, BOUNCE_TOKEN);
    a.send(peer, ...split(src.addr), 4, src.reg.desc, -1, 1);
    f.run();
    expect(got).toEqual([-265]);
  });
});
