// CUDA IPC (TSNET_OFI_GPU_IPC): GPU regions are registered twice, for CUDA IPC
// (FI_HMEM_DEVICE_ONLY) and plainly. The fake fabric behaves as libfabric's shm with CUDA:
// a write from an IPC registration completes on both sides before the target's
// device-to-device copy has run, and that copy reads the source as it is when the target
// host next reads locally. So a sender that reuses its buffer when the send completes (as
// NCCL does) corrupts the data unless its send waits for the receiver's acknowledgement, and
// a receiver sees its data only after its fence. An IPC registration used with the same
// process fails in the fake as in shm.
import { describe, expect, it } from 'vitest';
import { setLogSink } from '../../plugin/log';
import type { RecvComm, Region, SendComm } from '../../plugin/transports/ofi/fabric';
import { World, type WorldOptions, buf, expectBytes, pattern } from './harness';

const SEEDS = [1, 2, 3, 4, 5];
const EAGER = 1024;

function ipcWorld(seed: number, opts: WorldOptions = {}) {
  const w = new World({ seed, ...opts, config: { gpuIpc: true, ...opts.config } });
  const { send, recv } = w.connect();
  return { w, send, recv };
}

describe('CUDA IPC: acknowledged sends', () => {
  // One source buffer, overwritten with the next message as soon as a send completes.
  const cases = [
    { what: '1 NIC, 16 KiB', nics: 1, size: 16384 },
    { what: '2 NICs, 512 KiB striped', nics: 2, size: 512 * 1024 },
  ];
  for (const c of cases)
    it.each(SEEDS)(`a reused send buffer still delivers each message (${c.what}, seed %i)`, (seed) => {
      const { w, send, recv } = ipcWorld(seed, { nicsA: c.nics });
      const n = 12;
      const src = w.a.region(c.size, 'cuda', true);
      const dst = w.b.region(c.size * n, 'cuda', true);
      const msgs = Array.from({ length: n }, (_, i) => pattern(seed * 100 + i, c.size));
      for (let i = 0; i < n; i++) recv.irecv(100 + i, [buf(dst, i * c.size, c.size, 7)]);
      for (let i = 0; i < n; i++) {
        w.fabric.bytesOf(src).set(msgs[i]);
        send.isend(i, buf(src, 0, c.size, 7));
        w.run(() => w.a.has(i), `send ${i}`);
        expect(w.a.take(i)).toEqual({ code: 0, sizes: [c.size] });
      }
      w.run(() => Array.from({ length: n }, (_, i) => 100 + i).every((s) => w.b.has(s)), 'receives');
      for (let i = 0; i < n; i++) {
        expect(w.b.take(100 + i)).toEqual({ code: 0, sizes: [c.size] });
        expectBytes(w.fabric.bytesOf(dst), i * c.size, msgs[i]);
      }
      expect(w.fabric.ipcWrites).toBeGreaterThanOrEqual(n);
    });

  it.each(SEEDS)('a grouped receive of eager, GPU-written and host-written parts completes once, fenced (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const gpu = w.a.region(1 << 20, 'cuda', true);
    const data = pattern(seed, 1 << 20);
    w.fabric.bytesOf(gpu).set(data);
    const dGpu = w.b.region(1 << 20, 'cuda', true);
    const dHost = w.b.region(1 << 20, 'host');
    send.isend(1, buf(gpu, 0, EAGER, 1)); // eager, from the plain registration
    send.isend(2, buf(gpu, 65536, 40000, 2)); // written into GPU memory: fenced
    send.isend(3, buf(gpu, 262144, 30000, 3)); // written into host memory: a synchronous copy
    recv.irecv(9, [buf(dGpu, 0, 32768, 1), buf(dGpu, 65536, 65536, 2), buf(dHost, 0, 65536, 3)]);
    w.run(() => w.a.has(1, 2, 3) && w.b.has(9));
    expect(w.b.take(9)).toEqual({ code: 0, sizes: [EAGER, 40000, 30000] });
    expectBytes(w.fabric.bytesOf(dGpu), 0, data.subarray(0, EAGER));
    expectBytes(w.fabric.bytesOf(dGpu), 65536, data.subarray(65536, 65536 + 40000));
    expectBytes(w.fabric.bytesOf(dHost), 0, data.subarray(262144, 262144 + 30000));
    for (const s of [1, 2, 3]) expect(w.a.take(s).code).toBe(0);
    // The eager message left as a send (header + payload), never as an IPC write.
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send' && o.len === EAGER + 8)).toHaveLength(1);
    expect(w.fabric.ipcWrites).toBe(2);
  });

  it.each(SEEDS)('a receive into host memory only is acknowledged without a fence (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const gpu = w.a.region(65536, 'cuda', true);
    const data = pattern(seed, 65536);
    w.fabric.bytesOf(gpu).set(data);
    const host = w.b.region(65536, 'host');
    send.isend(1, buf(gpu, 0, 50000, 4));
    recv.irecv(2, [buf(host, 0, 65536, 4)]);
    w.run(() => w.a.has(1) && w.b.has(2));
    expectBytes(w.fabric.bytesOf(host), 0, data.subarray(0, 50000));
    expect(w.b.host.rails[0].log.filter((o) => o.type === 'read')).toHaveLength(0);
    expect(w.b.host.rails[0].log.filter((o) => o.type === 'write' && o.len === 0)).toHaveLength(1); // the acknowledgement
  });

  it.each(SEEDS)('0-byte sends and sends that do not fit are not IPC writes and wait for no acknowledgement (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const gpu = w.a.region(65536, 'cuda', true);
    const dst = w.b.region(65536, 'cuda', true);
    send.isend(1, buf(gpu, 0, 0, 1));
    send.isend(2, buf(gpu, 0, 40000, 2));
    recv.irecv(3, [buf(dst, 0, 0, 1)]);
    recv.irecv(4, [buf(dst, 0, 20000, 2)]);
    w.run(() => w.a.has(1, 2) && w.b.has(3, 4));
    expect(w.a.take(1).code).toBe(0);
    expect(w.a.take(2).code).not.toBe(0);
    expect(w.b.take(3)).toEqual({ code: 0, sizes: [0] });
    expect(w.b.take(4).code).not.toBe(0);
    expect(w.fabric.ipcWrites).toBe(0);
  });

  it.each(SEEDS)('under TSNET_FLUSH=auto, a fenced receive needs no second read; a later eager receive into the same buffer is flushed (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const src = w.a.region(65536, 'cuda', true);
    const dst = w.b.region(65536, 'cuda', true);
    const reads = () => w.b.host.rails[0].log.filter((o) => o.type === 'read').length;
    // A written receive, fenced, that is never flushed.
    send.isend(1, buf(src, 0, 40000, 1));
    recv.irecv(2, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.a.has(1) && w.b.has(2));
    expect(reads()).toBe(1); // the fence
    // An eager receive into the same buffer: no fence, so its flush reads.
    send.isend(3, buf(src, 0, EAGER, 1));
    recv.irecv(4, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.a.has(3) && w.b.has(4));
    const afterEager = reads(); // + the eager copy
    recv.iflush(5, [buf(dst, 0, EAGER, 1)]);
    w.run(() => w.b.has(5));
    expect(reads()).toBe(afterEager + 1);
    // A written receive again: its flush completes at once, with no read.
    send.isend(6, buf(src, 0, 30000, 1));
    recv.irecv(7, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.a.has(6) && w.b.has(7));
    const afterFence = reads();
    expect(afterFence).toBe(afterEager + 2);
    recv.iflush(8, [buf(dst, 0, 30000, 1)]);
    expect(w.b.take(8)).toEqual({ code: 0, sizes: [] });
    expect(reads()).toBe(afterFence);
  });

  it('with TSNET_FLUSH=read every receive is flushed, fenced or not', () => {
    const { w, send, recv } = ipcWorld(2, { config: { gpuIpc: true, flush: { method: 'read', all: true } } });
    const src = w.a.region(65536, 'cuda', true);
    const dst = w.b.region(65536, 'cuda', true);
    send.isend(1, buf(src, 0, 40000, 1));
    recv.irecv(2, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.a.has(1) && w.b.has(2));
    recv.iflush(3, [buf(dst, 0, 40000, 1)]);
    w.run(() => w.b.has(3));
    expect(w.b.host.rails[0].log.filter((o) => o.type === 'read')).toHaveLength(2);
  });

  it('a peer in the same process gets the plain registration (the fake fails IPC with its own host)', () => {
    const w = new World({ seed: 3, config: { gpuIpc: true } });
    const { send, recv } = w.connect(w.a, w.a);
    const src = w.a.region(1 << 20, 'cuda', true);
    const data = pattern(3, 1 << 20);
    w.fabric.bytesOf(src).set(data);
    const dst: Region = w.a.region(1 << 20, 'cuda', true);
    send.isend(1, buf(src, 0, 300000, 5));
    send.isend(2, buf(src, 400000, EAGER, 6));
    recv.irecv(3, [buf(dst, 0, 400000, 5), buf(dst, 500000, 4096, 6)]);
    w.run(() => w.a.has(1, 2, 3));
    expect(w.a.take(3)).toEqual({ code: 0, sizes: [300000, EAGER] });
    expectBytes(w.fabric.bytesOf(dst), 0, data.subarray(0, 300000));
    expectBytes(w.fabric.bytesOf(dst), 500000, data.subarray(400000, 400000 + EAGER));
    expect(w.fabric.ipcWrites).toBe(0);
  });

  it('without TSNET_OFI_GPU_IPC the IPC registration is never used', () => {
    const w = new World({ seed: 4 });
    const { send, recv } = w.connect();
    const src = w.a.region(65536, 'cuda', true);
    const dst = w.b.region(65536, 'cuda', true);
    send.isend(1, buf(src, 0, 50000, 1));
    recv.irecv(2, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.a.has(1) && w.b.has(2));
    expect(w.fabric.ipcWrites).toBe(0);
    expect(w.b.host.rails[0].log.filter((o) => o.type === 'read')).toHaveLength(0);
  });

  it('closing a send comm whose sends wait for acknowledgements neither hangs nor disturbs the next comm', () => {
    const { w, send, recv } = ipcWorld(6);
    const src = w.a.region(65536, 'cuda', true);
    const dst = w.b.region(65536, 'cuda', true);
    // Hold the receiver's acknowledgements (0-byte writes) so the sends stay waiting.
    w.fabric.hold = (type, len) => type === 'write' && len === 0;
    send.isend(1, buf(src, 0, 30000, 1));
    recv.irecv(2, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.b.has(2));
    expect(w.a.has(1)).toBe(false);
    send.close();
    recv.close();
    w.fabric.hold = undefined;
    w.settle();
    const next = w.connect();
    const data = pattern(6, 30000);
    w.fabric.bytesOf(src).set(data);
    next.send.isend(3, buf(src, 0, 30000, 1));
    next.recv.irecv(4, [buf(dst, 0, 65536, 1)]);
    w.run(() => w.a.has(3) && w.b.has(4));
    expect(w.a.take(3).code).toBe(0);
    expectBytes(w.fabric.bytesOf(dst), 0, data);
    expect(w.a.ep.stats.staleWrites).toBeGreaterThanOrEqual(1); // the held acknowledgement, for the closed comm
  });
});

describe('CUDA IPC: one round of fences for many receives', () => {
  const SIZE = 32768; // above the eager limit: written
  const reads = (w: World) => w.b.host.rails[0].log.filter((o) => o.type === 'read').length;
  // Reads wait until n receives wait for fences at b, then never again.
  function holdReadsUntil(w: World, n: number) {
    let open = false;
    w.fabric.hold = (type) => type === 'read' && !(open ||= w.b.ep.fences.waiting >= n);
  }

  // n sends of distinct data on each comm into receives of dst (each comm its own part).
  function many(w: World, comms: { send: SendComm; recv: RecvComm }[], n: number, dst: Region[]) {
    const src = w.a.region(SIZE * n * comms.length, 'cuda', true);
    const data = pattern(77, SIZE * n * comms.length);
    w.fabric.bytesOf(src).set(data);
    comms.forEach((c, k) => {
      for (let i = 0; i < n; i++) {
        const at = (k * n + i) * SIZE;
        c.recv.irecv(1000 * k + i, [buf(dst[k], i * SIZE, SIZE, 3)]);
        c.send.isend(1000 * k + i, buf(src, at, SIZE, 3));
      }
    });
    return (k: number, i: number) => data.subarray((k * n + i) * SIZE, (k * n + i + 1) * SIZE);
  }

  it.each(SEEDS)('receives of two comms that became ready while a round was in flight share the next round (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const second = w.connect();
    const comms = [{ send, recv }, second];
    const dst = [w.b.region(SIZE * 8, 'cuda', true), w.b.region(SIZE * 8, 'cuda', true)];
    // The fence reads wait until all 16 receives wait for a fence.
    holdReadsUntil(w, 16);
    const want = many(w, comms, 8, dst);
    const slots = [0, 1].flatMap((k) => Array.from({ length: 8 }, (_, i) => 1000 * k + i));
    w.run(() => w.b.has(...slots) && w.a.has(...slots), 'all sends and receives');
    for (const k of [0, 1])
      for (let i = 0; i < 8; i++) {
        expect(w.b.take(1000 * k + i)).toEqual({ code: 0, sizes: [SIZE] });
        expectBytes(w.fabric.bytesOf(dst[k]), i * SIZE, want(k, i));
      }
    // A round for the receive(s) ready first, then one round for all the others.
    expect(w.b.ep.fences.rounds).toBe(2);
    expect(w.b.ep.fences.fencedReceives).toBe(16);
    expect(reads(w)).toBe(2);
  });

  it.each(SEEDS)('a receive that became ready while a round was in flight waits for the next round (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const src = w.a.region(2 * SIZE, 'cuda', true);
    const data = pattern(seed, 2 * SIZE);
    w.fabric.bytesOf(src).set(data);
    const dst = w.b.region(2 * SIZE, 'cuda', true);
    recv.irecv(1, [buf(dst, 0, SIZE, 1)]);
    recv.irecv(2, [buf(dst, SIZE, SIZE, 2)]);
    // Receive 1's round is posted and held; receive 2's writes complete meanwhile.
    let held = true;
    w.fabric.hold = (type) => type === 'read' && held;
    send.isend(1, buf(src, 0, SIZE, 1));
    w.run(() => reads(w) === 1, 'the first round');
    send.isend(2, buf(src, SIZE, SIZE, 2));
    w.run(() => w.b.ep.fences.waiting === 2, 'receive 2 waiting');
    expect(w.b.has(1, 2)).toBe(false);
    held = false;
    w.run(() => w.b.has(1, 2) && w.a.has(1, 2));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [SIZE] });
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [SIZE] });
    // The fake runs a copy at a local read only if it was issued before that read was posted.
    expectBytes(w.fabric.bytesOf(dst), 0, data.subarray(0, SIZE));
    expectBytes(w.fabric.bytesOf(dst), SIZE, data.subarray(SIZE));
    expect(w.b.ep.fences.rounds).toBe(2);
  });

  it.each(SEEDS)('receives on different GPUs are fenced on their own GPU (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const src = w.a.region(3 * SIZE, 'cuda', true);
    const data = pattern(seed, 3 * SIZE);
    w.fabric.bytesOf(src).set(data);
    const gpu0 = w.b.region(2 * SIZE, 'cuda', true, 0);
    const gpu1 = w.b.region(SIZE, 'cuda', true, 1);
    recv.irecv(1, [buf(gpu0, 0, SIZE, 1)]);
    recv.irecv(2, [buf(gpu0, SIZE, SIZE, 2)]);
    recv.irecv(3, [buf(gpu1, 0, SIZE, 3)]);
    // Receive 1 gets a round on GPU 0; receives 2 (GPU 0) and 3 (GPU 1) wait for the next ones.
    holdReadsUntil(w, 3);
    send.isend(1, buf(src, 0, SIZE, 1));
    w.run(() => reads(w) === 1, 'the first round');
    send.isend(2, buf(src, SIZE, SIZE, 2));
    send.isend(3, buf(src, 2 * SIZE, SIZE, 3));
    w.run(() => w.b.has(1, 2, 3) && w.a.has(1, 2, 3));
    for (const s of [1, 2, 3]) expect(w.b.take(s)).toEqual({ code: 0, sizes: [SIZE] });
    expectBytes(w.fabric.bytesOf(gpu0), 0, data.subarray(0, 2 * SIZE));
    expectBytes(w.fabric.bytesOf(gpu1), 0, data.subarray(2 * SIZE));
    expect(w.b.ep.fences.rounds).toBe(3);
  });

  const ackWrites = (w: World) => w.b.host.rails[0].log.filter((o) => o.type === 'write' && o.len === 0).length;

  it.each(SEEDS)('the acknowledgements of a round leave in one write per comm, naming the others in the immediate data\'s high half (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const second = w.connect();
    const dst = [w.b.region(SIZE * 8, 'cuda', true), w.b.region(SIZE * 8, 'cuda', true)];
    holdReadsUntil(w, 16);
    const want = many(w, [{ send, recv }, second], 8, dst);
    const slots = [0, 1].flatMap((k) => Array.from({ length: 8 }, (_, i) => 1000 * k + i));
    w.run(() => w.b.has(...slots) && w.a.has(...slots), 'all sends and receives'); // every send was acknowledged
    for (const k of [0, 1]) for (let i = 0; i < 8; i++) expectBytes(w.fabric.bytesOf(dst[k]), i * SIZE, want(k, i));
    // One write per comm and round (16 receives, 2 rounds, 2 comms), not one per receive.
    expect(w.b.ep.fences.rounds).toBe(2);
    expect(ackWrites(w)).toBeLessThanOrEqual(4);
  });

  // n written receives on one comm, fenced in two rounds (the first ready, then the others); the acknowledgement writes.
  function oneComm(w: World, send: SendComm, recv: RecvComm, n: number): number {
    const dst = [w.b.region(SIZE * n, 'cuda', true)];
    holdReadsUntil(w, n);
    const want = many(w, [{ send, recv }], n, dst);
    const slots = Array.from({ length: n }, (_, i) => i);
    w.run(() => w.b.has(...slots) && w.a.has(...slots), 'all sends and receives');
    for (let i = 0; i < n; i++) expectBytes(w.fabric.bytesOf(dst[0]), i * SIZE, want(0, i));
    return ackWrites(w);
  }

  it.each(SEEDS)('more than 32 receives of a round take a write per 33 (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    expect(oneComm(w, send, recv, 40)).toBe(3); // 1; then 39 = 33 + 6
  });

  it.each(SEEDS)('with 4 bytes of immediate data every receive gets its own acknowledgement (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed, { fake: { cqDataBytes: 4 } });
    expect(oneComm(w, send, recv, 8)).toBe(8);
  });

  it('a failed fence read fails the comms whose receives waited for it, with the provider words', () => {
    const { w, send, recv } = ipcWorld(5);
    const warns: string[] = [];
    setLogSink((level, _f, msg) => {
      if (level === 2) warns.push(msg);
    });
    try {
      const src = w.a.region(SIZE, 'cuda', true);
      const dst = w.b.region(SIZE, 'cuda', true);
      w.b.host.rails[0].failNext({ type: 'read', status: -5, error: 'fake provider: copy engine fault' });
      recv.irecv(1, [buf(dst, 0, SIZE, 1)]);
      send.isend(1, buf(src, 0, SIZE, 1));
      w.run(() => w.b.has(1));
      expect(w.b.take(1).code).toBe(2);
      expect(warns.join('\n')).toMatch(/CUDA IPC fence \(local RDMA read\) on rail 0 failed: fake provider: copy engine fault \(EIO\)/);
      recv.irecv(2, [buf(dst, 0, SIZE, 1)]); // later requests fail at once
      expect(w.b.take(2).code).toBe(2);
    } finally {
      setLogSink(() => {});
    }
  });

  it.each(SEEDS)('a receive comm that closes while its receive waits for a round leaves the round to the others (seed %i)', (seed) => {
    const { w, send, recv } = ipcWorld(seed);
    const other = w.connect();
    const src = w.a.region(2 * SIZE, 'cuda', true);
    const data = pattern(seed, 2 * SIZE);
    w.fabric.bytesOf(src).set(data);
    const dst = w.b.region(2 * SIZE, 'cuda', true);
    holdReadsUntil(w, 2);
    recv.irecv(1, [buf(dst, 0, SIZE, 1)]);
    send.isend(1, buf(src, 0, SIZE, 1));
    other.recv.irecv(2, [buf(dst, SIZE, SIZE, 1)]);
    other.send.isend(2, buf(src, SIZE, SIZE, 1));
    w.run(() => w.b.ep.fences.waiting === 2, 'both receives waiting');
    recv.close();
    send.close();
    w.run(() => w.b.has(2) && w.a.has(2));
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [SIZE] });
    expectBytes(w.fabric.bytesOf(dst), SIZE, data.subarray(SIZE));
    expect(w.b.has(1)).toBe(false); // NCCL closed it: nothing is reported
    w.settle();
    expect(w.b.ep.fences.waiting).toBe(0);
  });
});
