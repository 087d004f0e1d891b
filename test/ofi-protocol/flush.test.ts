// Flush. The fake delays remote writes into the receive buffers ('until-read'; host memory made
// to behave like GPU memory behind PCIe): their completions come, their bytes are not visible
// until a read passes through that NIC. A receive can therefore complete before its bytes are there; a flush (one read
// per NIC, or a write then a read of the same line) completes only after they are.
import { describe, expect, it } from 'vitest';
import { OFI_DEFAULTS, type OfiConfig, readOfiConfig } from '../../plugin/transports/ofi/config';
import { World, buf, expectBytes, pattern } from './harness';

function setup(flush: OfiConfig['flush'], opts: ConstructorParameters<typeof World>[0] = {}, kind: 'host' | 'cuda' = 'host') {
  const w = new World({ fake: { lagWrites: 'until-read' }, ...opts, config: { ...OFI_DEFAULTS, flush, ...opts.config } });
  const { send, recv } = w.connect();
  const src = w.a.region(1 << 20);
  src.bytes!.set(pattern(3, 1 << 20));
  const dst = w.b.region(1 << 20, kind);
  w.fabric.lagging(dst); // host memory behaves like GPU memory behind PCIe here
  return { w, send, recv, src, dst };
}

/** A written receive of size bytes that has completed (its bytes possibly not visible yet). */
function received(s: ReturnType<typeof setup>, size: number): void {
  const { w, send, recv, src, dst } = s;
  recv.irecv(1, [buf(dst, 0, size, 0)]);
  w.settle();
  send.isend(1, buf(src, 0, size, 0));
  w.run(() => w.a.has(1) && w.b.has(1));
  expect(w.b.take(1).sizes).toEqual([size]);
}

const ops = (w: World) => w.b.host.rails.map((r) => r.log.filter((o) => o.imm < 0).map((o) => `${o.type} ${o.len}`));

describe('flush', () => {
  it('read: the receive completes before its bytes land; the flush only after', () => {
    const s = setup({ method: 'read', all: true });
    received(s, 100000);
    const mem = s.w.fabric.bytesOf(s.dst);
    expect(mem.subarray(0, 100000).every((b) => b === 0)).toBe(true); // not visible yet
    s.recv.iflush(2, [buf(s.dst, 0, 100000, 0)]);
    expect(s.w.b.has(2)).toBe(false);
    s.w.run(() => s.w.b.has(2));
    expect(s.w.b.take(2)).toEqual({ code: 0, sizes: [] });
    expectBytes(mem, 0, s.src.bytes!.subarray(0, 100000));
    expect(ops(s.w)).toEqual([['read 64']]);
    const read = s.w.b.host.rails[0].log.find((o) => o.type === 'read')!;
    expect(read.raddr).toBe(s.dst.base); // one cache line of the flushed buffer itself
  });

  it('write-read: writes a line first, reads that same line back after the write completed', () => {
    const s = setup({ method: 'write-read', all: true });
    received(s, 5000);
    s.recv.iflush(2, [buf(s.dst, 0, 5000, 0)]);
    s.w.run(() => s.w.b.has(2));
    expect(ops(s.w)).toEqual([['write 64', 'read 64']]);
    const log = s.w.b.host.rails[0].log.filter((o) => o.imm < 0);
    expect(log[1].raddr).toBe(log[0].raddr);
    expectBytes(s.w.fabric.bytesOf(s.dst), 0, s.src.bytes!.subarray(0, 5000));
  });

  it('write-read uses the device flush line the plugin gave', () => {
    const s = setup({ method: 'write-read', all: true }, { flushScratch: true });
    received(s, 5000);
    s.recv.iflush(2, [buf(s.dst, 0, 5000, 0)]);
    s.w.run(() => s.w.b.has(2));
    const log = s.w.b.host.rails[0].log.filter((o) => o.imm < 0);
    expect(log[0].raddr).toBe(s.w.b.ep.flushScratch!.base);
  });

  it('reads through every NIC of the comm', () => {
    const s = setup({ method: 'read', all: true }, { nicsA: 3 });
    received(s, 1 << 20);
    s.recv.iflush(2, [buf(s.dst, 0, 1 << 20, 0)]);
    s.w.run(() => s.w.b.has(2));
    expect(ops(s.w)).toEqual([['read 64'], ['read 64'], ['read 64']]);
    expectBytes(s.w.fabric.bytesOf(s.dst), 0, s.src.bytes!.subarray(0, 1 << 20));
  });

  it('auto: host memory needs none (completes at once, no operation)', () => {
    const s = setup(readOfiConfig({}).config.flush);
    received(s, 5000);
    s.recv.iflush(2, [buf(s.dst, 0, 5000, 0)]);
    expect(s.w.b.take(2)).toEqual({ code: 0, sizes: [] });
    expect(ops(s.w)).toEqual([[]]);
  });

  it.each([
    [{}, ['read 64']],
    [{ OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE: '1' }, ['write 64', 'read 64']],
    [{ OFI_NCCL_GDR_FLUSH_DISABLE: '1' }, []],
    [{ TSNET_FLUSH: 'none' }, []],
  ])('auto on GPU memory with %o: %o', (env, want) => {
    const s = setup(readOfiConfig(env).config.flush, {}, 'cuda');
    received(s, 5000);
    s.recv.iflush(2, [buf(s.dst, 0, 5000, 0)]);
    s.w.run(() => s.w.b.has(2));
    expect(ops(s.w)).toEqual([want]);
    const mem = s.w.fabric.bytesOf(s.dst);
    if (want.length) expectBytes(mem, 0, s.src.bytes!.subarray(0, 5000));
    else expect(mem.subarray(0, 5000).every((b) => b === 0), 'unflushed: not visible in this model').toBe(true);
  });

  it('flushes the first non-empty buffer of a group, a short one by its length; empty groups need nothing', () => {
    const s = setup({ method: 'read', all: true });
    s.recv.iflush(1, [buf(null, 0, 0, 0), buf(s.dst, 64, 0, 1)]);
    expect(s.w.b.take(1)).toEqual({ code: 0, sizes: [] });
    s.recv.iflush(2, [buf(null, 0, 0, 0), buf(s.dst, 128, 10, 1), buf(s.dst, 4096, 100, 2)]);
    s.w.run(() => s.w.b.has(2));
    expect(ops(s.w)).toEqual([['read 10']]);
    expect(s.w.b.host.rails[0].log.find((o) => o.type === 'read')!.raddr).toBe(s.dst.base + 128);
  });

  it('a flush on a failed comm completes with its error', async () => {
    const s = setup({ method: 'read', all: true });
    const { remoteError } = await import('../../plugin/errors');
    s.recv.fail(remoteError('test: gone'));
    s.recv.iflush(1, [buf(s.dst, 0, 100, 0)]);
    expect(s.w.b.take(1).code).toBe(6);
  });
});
