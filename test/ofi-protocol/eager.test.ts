// Eager sends into single and grouped receives: every case of aws-ofi-nccl's eager_multirecv
// functional tests, each over several seeds (random interleavings), host and GPU memory.
import { describe, expect, it } from 'vitest';
import type { RecvComm, Region, SendComm } from '../../plugin/transports/ofi/fabric';
import { World, buf, expectBytes, pattern } from './harness';

const EAGER = 1024; // goes eager (default limit 8192)
const LARGE = 16384; // never eager
const SEEDS = [1, 2, 3, 4, 5];

interface Msg {
  tag: number;
  size: number;
}

/** A world, a connected pair, a source region full of patterns, a destination region. */
function setup(seed: number, kind: 'host' | 'cuda' = 'host', opts: ConstructorParameters<typeof World>[0] = {}) {
  const w = new World({ seed, ...opts });
  const { send, recv } = w.connect();
  const src = w.a.region(2 << 20);
  src.bytes!.set(pattern(seed, 2 << 20));
  const dst = w.b.region(1 << 20, kind);
  return { w, send, recv, src, dst };
}

/** Posts sends of msgs from src (message i at offset i * 32 KiB), slots 1.. */
function sendAll(send: SendComm, src: Region, msgs: Msg[], first = 1): void {
  msgs.forEach((m, i) => send.isend(first + i, buf(src, i * 32768, m.size, m.tag)));
}

/** Runs until the eager messages sit at the receiver (every send posted, nothing left to execute). */
function deliverEager(w: World): void {
  w.fabric.run(() => w.fabric.ops.length === 0 && w.sides.every((s) => s.host.rails.every((r) => r.cq.length === 0)));
}

/** Posts a receive of tags (buffers of 32 KiB each at dstOff + i * 32 KiB). */
function recvGroup(recv: RecvComm, dst: Region, slot: number, tags: number[], dstOff: number): void {
  recv.irecv(
    slot,
    tags.map((t, i) => buf(dst, dstOff + i * 32768, 32768, t)),
  );
}

/** Expects sub-buffer (dstOff + i * 32 KiB) to hold message m (sent from offset m * 32 KiB). */
function expectPlaced(w: World, src: Region, dst: Region, dstOff: number, msgIndex: number, size: number): void {
  expectBytes(w.fabric.bytesOf(dst), dstOff, src.bytes!.subarray(msgIndex * 32768, msgIndex * 32768 + size));
}

const kinds = ['host', 'cuda'] as const;

describe.each(kinds)('eager into %s memory', (kind) => {
  it.each(SEEDS)('late receive: the message waits in a bounce buffer (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [{ tag: 1, size: EAGER }]);
    deliverEager(w);
    expect(w.b.ep.pool.accounts[0].held).toBe(1);
    expect(w.a.has(1)).toBe(false); // an eager send completes once its control message matched it
    recvGroup(recv, dst, 1, [1], 0);
    w.run(() => w.a.has(1) && w.b.has(1));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [EAGER] });
    expect(w.a.take(1)).toEqual({ code: 0, sizes: [EAGER] });
    expectPlaced(w, src, dst, 0, 0, EAGER);
    w.settle();
    expect(w.b.ep.pool.accounts[0].held).toBe(0);
  });

  it.each(SEEDS)('early receive: posted before the send, whose control message has not arrived yet (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    recvGroup(recv, dst, 1, [1], 0);
    sendAll(send, src, [{ tag: 1, size: EAGER }]);
    w.run(() => w.a.has(1) && w.b.has(1));
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send' && o.len === EAGER + 8)).toHaveLength(1);
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [EAGER] });
    expectPlaced(w, src, dst, 0, 0, EAGER);
  });

  it.each(SEEDS)('4 eager messages into 4 single receives, in order (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [1, 2, 3, 4].map(() => ({ tag: 1, size: 100 + seed })));
    deliverEager(w);
    for (let i = 0; i < 4; i++) recvGroup(recv, dst, 1 + i, [1], i * 32768);
    w.run(() => w.b.has(1, 2, 3, 4) && w.a.has(1, 2, 3, 4));
    for (let i = 0; i < 4; i++) expectPlaced(w, src, dst, i * 32768, i, 100 + seed);
  });

  it.each(SEEDS)('grouped receive (n=2) all eager (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [
      { tag: 10, size: EAGER },
      { tag: 11, size: EAGER / 2 },
    ]);
    deliverEager(w);
    recvGroup(recv, dst, 1, [10, 11], 0);
    w.run(() => w.b.has(1) && w.a.has(1, 2));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [EAGER, EAGER / 2] });
    expectPlaced(w, src, dst, 0, 0, EAGER);
    expectPlaced(w, src, dst, 32768, 1, EAGER / 2);
  });

  it.each(SEEDS)('grouped receive (n=3) mixed eager and written (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [
      { tag: 20, size: EAGER },
      { tag: 21, size: LARGE },
      { tag: 22, size: LARGE },
    ]);
    recvGroup(recv, dst, 1, [20, 21, 22], 0);
    w.run(() => w.b.has(1) && w.a.has(1, 2, 3));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [EAGER, LARGE, LARGE] });
    for (let i = 0; i < 3; i++) expectPlaced(w, src, dst, i * 32768, i, i ? LARGE : EAGER);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'write' && o.len === LARGE)).toHaveLength(2);
  });

  it.each(SEEDS)('grouped receive (n=2) all written (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    recvGroup(recv, dst, 1, [30, 31], 0);
    sendAll(send, src, [
      { tag: 30, size: LARGE },
      { tag: 31, size: LARGE },
    ]);
    w.run(() => w.b.has(1) && w.a.has(1, 2));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [LARGE, LARGE] });
    expectPlaced(w, src, dst, 0, 0, LARGE);
    expectPlaced(w, src, dst, 32768, 1, LARGE);
  });

  it.each(SEEDS)('eager across a single and a grouped receive (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [1, 40, 41].map((tag) => ({ tag, size: EAGER })));
    deliverEager(w);
    recvGroup(recv, dst, 1, [1], 0);
    recvGroup(recv, dst, 2, [40, 41], 32768);
    w.run(() => w.b.has(1, 2) && w.a.has(1, 2, 3));
    expectPlaced(w, src, dst, 0, 0, EAGER);
    expectPlaced(w, src, dst, 32768, 1, EAGER);
    expectPlaced(w, src, dst, 65536, 2, EAGER);
  });

  it.each(SEEDS)('tag push-back across two groups: sends [B, D, A, C] into [B, D] then [A, C] (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [51, 53, 50, 52].map((tag) => ({ tag, size: EAGER })));
    deliverEager(w);
    recvGroup(recv, dst, 1, [51, 53], 0);
    recvGroup(recv, dst, 2, [50, 52], 65536);
    w.run(() => w.b.has(1, 2) && w.a.has(1, 2, 3, 4));
    expectPlaced(w, src, dst, 0, 0, EAGER);
    expectPlaced(w, src, dst, 32768, 1, EAGER);
    expectPlaced(w, src, dst, 65536, 2, EAGER);
    expectPlaced(w, src, dst, 98304, 3, EAGER);
  });

  it.each(SEEDS)('32 queued eager messages, then 32 single receives (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    const msgs = Array.from({ length: 32 }, (_, i) => ({ tag: 1, size: 64 + i }));
    sendAll(send, src, msgs);
    deliverEager(w);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send')).toHaveLength(1 + 32); // CONNECT + 32 eager
    for (let i = 0; i < 32; i++) recvGroup(recv, dst, 1 + i, [1], i * 32768);
    w.run(() => w.b.done.size === 32 && w.a.done.size === 32);
    for (let i = 0; i < 32; i++) expectPlaced(w, src, dst, i * 32768, i, 64 + i);
    for (let i = 0; i < 32; i++) expect(w.b.done.get(1 + i)).toEqual({ code: 0, sizes: [64 + i] });
  });

  it.each(SEEDS)('a 33rd send waits for a control message instead of going eager (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, Array.from({ length: 33 }, () => ({ tag: 1, size: 10 })));
    deliverEager(w);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send')).toHaveLength(1 + 32);
    for (let i = 0; i < 33; i++) recvGroup(recv, dst, 1 + i, [1], (i % 30) * 32768);
    w.run(() => w.b.done.size === 33 && w.a.done.size === 33);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'write' && o.len === 10)).toHaveLength(1);
  });

  it.each(SEEDS)('the exact size boundary: limit - 8 goes eager, limit - 7 is written (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind, { config: { eagerMax: 4096 } });
    sendAll(send, src, [
      { tag: 1, size: 4096 - 8 },
      { tag: 1, size: 4096 - 7 },
    ]);
    deliverEager(w);
    const log = w.a.host.rails[0].log;
    expect(log.filter((o) => o.type === 'send' && o.len === 4096)).toHaveLength(1); // header + 4088
    expect(log.some((o) => o.type === 'write' && o.len === 4089)).toBe(false); // waits for its control message
    recvGroup(recv, dst, 1, [1], 0);
    recvGroup(recv, dst, 2, [1], 32768);
    w.run(() => w.b.has(1, 2) && w.a.has(1, 2));
    expect(log.filter((o) => o.type === 'write' && o.len === 4089)).toHaveLength(1);
    expect(w.b.take(1).sizes).toEqual([4088]);
    expect(w.b.take(2).sizes).toEqual([4089]);
    expectPlaced(w, src, dst, 0, 0, 4088);
    expectPlaced(w, src, dst, 32768, 1, 4089);
  });

  it.each(SEEDS)('every permutation of 4 tags into one group of 4 (seed %i)', (seed) => {
    const tags = [60, 61, 62, 63];
    const perms: number[][] = [];
    const permute = (rest: number[], acc: number[]) => {
      if (!rest.length) perms.push(acc);
      rest.forEach((t, i) => permute([...rest.slice(0, i), ...rest.slice(i + 1)], [...acc, t]));
    };
    permute(tags, []);
    const { w, send, recv, src, dst } = setup(seed, kind);
    let slot = 1;
    perms.forEach((p, k) => {
      const first = slot;
      sendAll(send, src, p.map((tag) => ({ tag, size: 200 + tag })), first);
      slot += 4;
      if (k % 2) deliverEager(w); // half the groups after their messages, half before
      recvGroup(recv, dst, 1000 + k, tags, 0);
      w.run(() => w.b.has(1000 + k) && w.a.has(first, first + 1, first + 2, first + 3));
      expect(w.b.take(1000 + k).sizes).toEqual(tags.map((t) => 200 + t));
      tags.forEach((t, i) => expectPlaced(w, src, dst, i * 32768, p.indexOf(t), 200 + t));
    });
  });

  it.each(SEEDS)('equal tags keep their order across receives (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [7, 7, 8, 7, 8].map((tag, i) => ({ tag, size: 10 + i })));
    deliverEager(w);
    recvGroup(recv, dst, 1, [7, 8, 7], 0);
    recvGroup(recv, dst, 2, [8, 7], 3 * 32768);
    w.run(() => w.b.has(1, 2) && w.a.done.size === 5);
    expect(w.b.take(1).sizes).toEqual([10, 12, 11]);
    expect(w.b.take(2).sizes).toEqual([14, 13]);
  });

  it.each(SEEDS)('interleaved sends over two groups of 8 (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    const msgs: Msg[] = [];
    for (let t = 0; t < 8; t++) msgs.push({ tag: t, size: 100 + t }, { tag: t, size: 300 + t });
    sendAll(send, src, msgs);
    if (seed % 2) deliverEager(w);
    recvGroup(recv, dst, 1, [0, 1, 2, 3, 4, 5, 6, 7], 0);
    recvGroup(recv, dst, 2, [7, 6, 5, 4, 3, 2, 1, 0], 8 * 32768);
    w.run(() => w.b.has(1, 2) && w.a.done.size === 16);
    expect(w.b.take(1).sizes).toEqual([0, 1, 2, 3, 4, 5, 6, 7].map((t) => 100 + t));
    expect(w.b.take(2).sizes).toEqual([7, 6, 5, 4, 3, 2, 1, 0].map((t) => 300 + t));
    for (let t = 0; t < 8; t++) {
      expectPlaced(w, src, dst, t * 32768, 2 * t, 100 + t);
      expectPlaced(w, src, dst, (15 - t) * 32768, 2 * t + 1, 300 + t);
    }
  });

  it.each(SEEDS)('eager batches spanning three groups, control messages arriving between them (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    // Batch 1 (base 0): tags 0 1 2 0; the first group's control message arrives; batch 2 (base 1)...
    sendAll(send, src, [0, 1, 2, 0].map((tag, i) => ({ tag, size: 50 + i })), 1);
    deliverEager(w);
    recvGroup(recv, dst, 101, [0, 1, 2], 0);
    deliverEager(w);
    sendAll(send, src, [1, 2, 0].map((tag, i) => ({ tag, size: 60 + i })), 5);
    deliverEager(w);
    recvGroup(recv, dst, 102, [0, 1, 2], 3 * 32768);
    sendAll(send, src, [1, 2].map((tag, i) => ({ tag, size: 70 + i })), 8);
    recvGroup(recv, dst, 103, [0, 1, 2], 6 * 32768);
    w.run(() => w.b.has(101, 102, 103) && w.a.done.size === 9);
    expect(w.b.take(101).sizes).toEqual([50, 51, 52]);
    expect(w.b.take(102).sizes).toEqual([53, 60, 61]);
    expect(w.b.take(103).sizes).toEqual([62, 70, 71]);
  });

  it.each(SEEDS)('alternating single and grouped receives (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    const groups = [[5], [1, 2], [5], [2, 1, 3], [5]];
    const sends = [5, 1, 2, 5, 3, 2, 1, 5];
    sendAll(send, src, sends.map((tag, i) => ({ tag, size: 20 + i })));
    if (seed % 2) deliverEager(w);
    let off = 0;
    groups.forEach((g, k) => {
      recvGroup(recv, dst, 100 + k, g, off);
      off += g.length * 32768;
    });
    w.run(() => groups.every((_, k) => w.b.has(100 + k)) && w.a.done.size === sends.length);
    expect(groups.map((_, k) => w.b.take(100 + k).sizes)).toEqual([[20], [21, 22], [23], [25, 26, 24], [27]]);
  });

  it.each(SEEDS)('an eager message skips the entry a write still in flight will fill (seed %i)', (seed) => {
    const { w, send, recv, src, dst } = setup(seed, kind);
    recvGroup(recv, dst, 1, [1], 0);
    deliverEager(w); // the sender knows receive 0
    w.fabric.hold = (type, len) => type === 'write' && len === LARGE;
    sendAll(send, src, [
      { tag: 1, size: LARGE }, // written into receive 0, held back
      { tag: 1, size: 99 }, // eager, for receive 1, arrives first
    ]);
    recvGroup(recv, dst, 2, [1], 32768);
    deliverEager(w);
    expect(w.b.has(1, 2)).toBe(false);
    w.fabric.hold = undefined;
    w.run(() => w.b.has(1, 2) && w.a.has(1, 2));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [LARGE] });
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [99] });
    expectPlaced(w, src, dst, 0, 0, LARGE);
    expectPlaced(w, src, dst, 32768, 1, 99);
  });

  it.each(SEEDS)('a receiver that posts one receive at a time does not deadlock (seed %i)', (seed) => {
    // Receive 0 wants tag 3, receive 1 tag 5; the sender sends tag 5 first, both eager.
    // Tag 5's message cannot be placed until receive 1 is posted, which waits for receive 0.
    const { w, send, recv, src, dst } = setup(seed, kind);
    sendAll(send, src, [
      { tag: 5, size: 30 },
      { tag: 3, size: 40 },
    ]);
    deliverEager(w);
    recvGroup(recv, dst, 1, [3], 0);
    w.run(() => w.b.has(1), 'receive 0 completes before receive 1 is posted');
    expect(w.b.take(1).sizes).toEqual([40]);
    recvGroup(recv, dst, 2, [5], 32768);
    w.run(() => w.b.has(2) && w.a.has(1, 2));
    expect(w.b.take(2).sizes).toEqual([30]);
    expectPlaced(w, src, dst, 32768, 0, 30);
  });
});

// libfabric before 1.18 cannot gather a host header and a GPU payload in one send (its shm
// provider copied both as the first iovec's memory and the sender died of SIGSEGV on the GPU
// host). There the endpoint does not send GPU memory eager: such sends wait for their control
// message and are written, while host sends still go eager.
describe('sends from GPU memory where a send cannot gather host and GPU memory', () => {
  function gpuSetup(seed: number, gpuEager: boolean) {
    const w = new World({ seed, fake: { mixedIov: false }, gpuEager });
    const { send, recv } = w.connect();
    const gpu = w.a.region(1 << 20, 'cuda');
    const host = w.a.region(1 << 20);
    const data = pattern(seed, 1 << 20);
    w.fabric.bytesOf(gpu).set(data);
    host.bytes!.set(data);
    const dst = w.b.region(1 << 20, 'cuda');
    return { w, send, recv, gpu, host, dst, data };
  }

  it('the fake fabric refuses such a send, as the provider crashes on it', () => {
    const { w, send, gpu } = gpuSetup(1, true);
    expect(() => {
      send.isend(1, buf(gpu, 0, EAGER, 1));
      deliverEager(w);
    }).toThrow(/gathers host and GPU memory/);
  });

  it.each(SEEDS)('GPU sends are written after their control message, host sends still go eager (seed %i)', (seed) => {
    const { w, send, recv, gpu, host, dst, data } = gpuSetup(seed, false);
    send.isend(1, buf(gpu, 0, EAGER, 1)); // small, from GPU memory: waits
    send.isend(2, buf(host, 32768, 100, 2)); // waits behind it (eager order)
    deliverEager(w);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send' && (o.len === EAGER + 8 || o.len === 100 + 8))).toHaveLength(0);
    recv.irecv(1, [buf(dst, 0, 32768, 1)]);
    recv.irecv(2, [buf(dst, 32768, 32768, 2)]);
    w.run(() => w.a.has(1, 2) && w.b.has(1, 2));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [EAGER] });
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [100] });
    expectBytes(w.fabric.bytesOf(dst), 0, data.subarray(0, EAGER));
    expectBytes(w.fabric.bytesOf(dst), 32768, data.subarray(32768, 32768 + 100));
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'write' && o.len === EAGER)).toHaveLength(1);
    // With nothing waiting, a host send goes eager again.
    send.isend(3, buf(host, 65536, 200, 3));
    deliverEager(w);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send' && o.len === 200 + 8)).toHaveLength(1);
    recv.irecv(3, [buf(dst, 65536, 32768, 3)]);
    w.run(() => w.a.has(3) && w.b.has(3));
    expectBytes(w.fabric.bytesOf(dst), 65536, data.subarray(65536, 65536 + 200));
  });
});
