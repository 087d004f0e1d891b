// Long random runs against a reference model of the matching rule: random receives (single and
// grouped, few tags so that they repeat), sends of every entry's tag, shuffled within a random
// distance, random sizes (all eager-sized, or around every threshold: 0, 1, eager limit - 8 /
// - 7, small round-robin, multi-stripe 28 KiB and more), random configurations (rails,
// FI_RX_CQ_DATA, offsets or virtual addresses, 4 or 8 bytes of CQ data, eager on or off, a
// tiny bounce window), host or GPU memory, posted at random moments between random fabric
// steps, each side's pace and window changing every few hundred steps. After every step: exact bounce-buffer accounting on both sides. At the
// end: every request completed once, with the sizes and bytes the model says.
import { describe, expect, it } from 'vitest';
import type { ReqBuf } from '../../plugin/transports/ofi/fabric';
import { rng } from './fake-fabric';
import { World, expectBytes, pattern } from './harness';

interface Recv {
  tags: number[];
  sizes: number[]; // buffer sizes, filled in once the sends are known
  offsets: number[];
  want: number[]; // the send each entry gets
}

/** The matching rule, written the obvious way: earliest receive with an unused entry of the tag. */
function model(recvs: Recv[], sendTags: number[]): [number, number][] {
  const used = recvs.map((r) => r.tags.map(() => false));
  return sendTags.map((t, s) => {
    for (let r = 0; r < recvs.length; r++)
      for (let i = 0; i < recvs[r].tags.length; i++)
        if (!used[r][i] && recvs[r].tags[i] === t) {
          used[r][i] = true;
          recvs[r].want[i] = s;
          return [r, i];
        }
    throw new Error('model: a send without a receive');
  });
}

function runRandom(seed: number, receives = 40): void {
  const rand = rng(seed * 1000 + 17);
  const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)];
  const nics = pick([1, 1, 2, 3]);
  // Half the runs are all eager-sized (eager on), half spread sizes around every threshold.
  const small = rand() < 0.5;
  const eagerMax = small ? pick([256, 8192]) : pick([-1, 256, 8192, 8192]);
  const kind = pick(['host', 'cuda'] as const);
  const w = new World({
    seed,
    nicsA: nics,
    nicsB: pick([1, nics]),
    fake: { rxCqData: rand() < 0.5, virtAddr: rand() < 0.5, cqDataBytes: pick([4, 8]), maxBatch: pick([1, 4, 16]), sourceWrites: rand() < 0.5, shmSource: rand() < 0.3 },
    config: { eagerMax, minStripe: pick([1024, 4096, 131072]), smallRrMax: 64, rrCtrl: rand() < 0.5, bouncePosted: pick([2, 8, 64]), smallRail: seed % 2 ? 'comm' : 'rr' },
  });
  const { send, recv } = w.connect();

  // Receives and sends.
  const nRecv = receives + Math.floor(rand() * receives);
  const recvs: Recv[] = [];
  const tags: number[] = [];
  for (let r = 0; r < nRecv; r++) {
    const n = pick([1, 1, 2, 3, 4, 8]);
    const rt = Array.from({ length: n }, () => Math.floor(rand() * 4));
    recvs.push({ tags: rt, sizes: [], offsets: [], want: [] });
    tags.push(...rt);
  }
  // Sends come in receive order, shuffled locally (NCCL posts a step's sends together; tags
  // pick the entries, so they may come in any order within a few steps).
  const spread = pick([0, 4, 16, 64]);
  for (let i = 0; i < tags.length; i++) {
    const j = Math.min(tags.length - 1, i + Math.floor(rand() * spread));
    [tags[i], tags[j]] = [tags[j], tags[i]];
  }
  const where = model(recvs, tags);
  const lim = eagerMax < 0 ? 8192 : eagerMax;
  const sizes = tags.map(() =>
    small ? pick([0, 1, 7, 63, 64, 200, lim - 8]) : pick([0, 1, 7, 63, 64, 200, lim - 8, lim - 7, 4096, 28 * 1024, 40000, 100000]),
  );
  // The pace of each side changes every few hundred steps: a slow receiver lets sends run
  // ahead of the control messages (eager, parking), a fast one makes them written. Windows:
  // receives in flight (NCCL allows 32), and how many receives past the oldest incomplete one
  // the sender may send for (NCCL: steps in flight).
  let recvRate = 0;
  let sendRate = 0;
  let recvWindow = 0;
  let sendAhead = 0;
  const phase = () => {
    recvRate = pick([0.02, 0.1, 0.3, 1]);
    sendRate = pick([0.1, 0.3, 0.8]);
    recvWindow = pick([1, 2, 8, 32]);
    sendAhead = spread + pick([2, 8, 40]);
  };
  const srcOff: number[] = [];
  let at = 0;
  for (const s of sizes) {
    srcOff.push(at);
    at += Math.ceil((s + 1) / 64) * 64;
  }
  const src = w.a.region(at);
  src.bytes!.set(pattern(seed, at));
  let dAt = 0;
  sizes.forEach((s, k) => {
    const [r, i] = where[k];
    recvs[r].sizes[i] = s + pick([0, 0, 1, 100]);
    recvs[r].offsets[i] = dAt;
    dAt += Math.ceil((recvs[r].sizes[i] + 1) / 64) * 64;
  });
  const dst = w.b.region(dAt, kind);

  // Post at random moments, each side within its window.
  let nextRecv = 0;
  let nextSend = 0;
  const guard = 4_000_000;
  let floor = 0; // the oldest receive not complete
  for (let step = 0; step < guard; step++) {
    if (step % 300 === 0) phase();
    const recvsInFlight = nextRecv - w.b.done.size;
    while (w.b.done.has(floor)) floor++;
    if (nextRecv < nRecv && recvsInFlight < recvWindow && rand() < recvRate) {
      const r = recvs[nextRecv];
      const bufs: ReqBuf[] = r.tags.map((t, i) => ({ region: r.sizes[i] ? dst : null, offset: r.sizes[i] ? r.offsets[i] : 0, size: r.sizes[i], tag: t }));
      recv.irecv(nextRecv++, bufs);
    }
    if (nextSend < tags.length && where[nextSend][0] < floor + sendAhead && rand() < sendRate) {
      const k = nextSend++;
      send.isend(k, { region: sizes[k] ? src : null, offset: sizes[k] ? srcOff[k] : 0, size: sizes[k], tag: tags[k] });
    }
    if (nextRecv === nRecv && nextSend === tags.length && w.b.done.size === nRecv && w.a.done.size === tags.length) break;
    if (!w.fabric.step() && nextRecv === nRecv && nextSend === tags.length) throw new Error(`stuck: ${w.b.done.size}/${nRecv} receives, ${w.a.done.size}/${tags.length} sends done`);
    w.check();
  }
  expect(w.b.done.size).toBe(nRecv);
  expect(w.a.done.size).toBe(tags.length);
  for (let k = 0; k < tags.length; k++) expect(w.a.done.get(k), `send ${k}`).toEqual({ code: 0, sizes: [sizes[k]] });
  const mem = w.fabric.bytesOf(dst);
  recvs.forEach((r, k) => {
    expect(w.b.done.get(k), `receive ${k}`).toEqual({ code: 0, sizes: r.want.map((s) => sizes[s]) });
    r.want.forEach((s, i) => expectBytes(mem, r.offsets[i], src.bytes!.subarray(srcOff[s], srcOff[s] + sizes[s])));
  });
  w.settle();
  if (process.env.OFI_RANDOM_STATS) {
    const eager = w.a.host.rails.reduce((n, r) => n + r.log.filter((o) => o.type === 'send' && o.imm >= 0 && (o.imm >>> 15) === 1).length, 0);
    const writes = w.a.host.rails.reduce((n, r) => n + r.log.filter((o) => o.type === 'write').length, 0);
    const acc = w.b.ep.pool.accounts.map((a) => `${a.consumed}/${a.buffers}`).join(' ');
    console.log(`seed ${seed}: ${nRecv} receives, ${tags.length} sends, ${eager} eager, ${writes} writes, ${w.fabric.steps} steps, receiver consumed/buffers per rail ${acc}`);
  }
  for (const side of [w.a, w.b]) {
    side.check();
    for (const a of side.ep.pool.accounts) expect(a.held).toBe(0);
    expect(side.ep.ops.inflight).toBe(0);
  }
}

describe('random runs against the matching model', () => {
  it.each(Array.from({ length: 24 }, (_, i) => i + 1))('seed %i', (seed) => runRandom(seed));
  it.each([101, 102, 103, 104])('long run, seed %i (400 to 800 receives)', (seed) => runRandom(seed, 400));
});
