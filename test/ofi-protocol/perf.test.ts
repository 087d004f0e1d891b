// The protocol's CPU cost per message, over a lean loopback fabric that allocates nothing per
// operation (one heap, typed-array queues, reused completion objects) so that what is measured
// is the TypeScript protocol: isend/irecv, matching, eager placement, completion handling, for
// both ends on one thread. Prints the rates; fails only far below what a protocol thread needs.
import { ADDR_SPLIT } from '../../plugin/addr';
import { performance } from 'node:perf_hooks';
import { describe, expect, it } from 'vitest';
import { allocatedBy, pluginSites } from '../support/allocation';
import { OFI_DEFAULTS } from '../../plugin/transports/ofi/config';
import { OfiEndpoint } from '../../plugin/transports/ofi/endpoint';
import { type Completion, CqFlag, type HostBuffer, type Rail, type Region, type Registration, type ReqBuf } from '../../plugin/transports/ofi/fabric';

const BASE = 0x1000_0000;
const Q = 1 << 16;

class LoopNet {
  readonly heap = new Uint8Array(256 << 20);
  private top = 0;
  readonly rails: LoopRail[] = [];
  // Queued operations.
  n = 0;
  readonly op = new Uint8Array(Q);
  readonly src = new Int32Array(Q);
  readonly peer = new Int32Array(Q);
  readonly a0 = new Float64Array(Q);
  readonly l0 = new Float64Array(Q);
  readonly a1 = new Float64Array(Q);
  readonly l1 = new Float64Array(Q);
  readonly raddr = new Float64Array(Q);
  readonly imm = new Float64Array(Q);
  readonly token = new Float64Array(Q);

  alloc(bytes: number): number {
    const addr = BASE + this.top;
    this.top += Math.ceil(bytes / 4096) * 4096;
    return addr;
  }

  push(op: number, src: number, peer: number, a0: number, l0: number, a1: number, l1: number, raddr: number, imm: number, token: number): void {
    const i = this.n++;
    this.op[i] = op;
    this.src[i] = src;
    this.peer[i] = peer;
    this.a0[i] = a0;
    this.l0[i] = l0;
    this.a1[i] = a1;
    this.l1[i] = l1;
    this.raddr[i] = raddr;
    this.imm[i] = imm;
    this.token[i] = token;
  }

  /** Executes every queued operation in order, then delivers every completion queue. */
  pump(): void {
    const h = this.heap;
    for (let i = 0; i < this.n; i++) {
      const s = this.rails[this.src[i]];
      const d = this.rails[this.peer[i]];
      const imm = this.imm[i];
      if (this.op[i] === 1) {
        const rx = d.take();
        let at = d.rxAddr[rx] - BASE;
        h.copyWithin(at, this.a0[i] - BASE, this.a0[i] - BASE + this.l0[i]);
        at += this.l0[i];
        if (this.l1[i]) h.copyWithin(at, this.a1[i] - BASE, this.a1[i] - BASE + this.l1[i]);
        d.complete(d.rxToken[rx], CqFlag.RECV | (imm >= 0 ? CqFlag.REMOTE_CQ_DATA : 0), this.l0[i] + this.l1[i], imm >= 0 ? imm : 0);
        s.complete(this.token[i], CqFlag.SEND, 0, 0);
      } else if (this.op[i] === 2) {
        h.copyWithin(this.raddr[i] - BASE, this.a0[i] - BASE, this.a0[i] - BASE + this.l0[i]);
        if (imm >= 0) d.complete(0, CqFlag.REMOTE_WRITE | CqFlag.REMOTE_CQ_DATA, this.l0[i], imm);
        s.complete(this.token[i], CqFlag.WRITE, 0, 0);
      } else {
        h.copyWithin(this.a0[i] - BASE, this.raddr[i] - BASE, this.raddr[i] - BASE + this.l0[i]);
        s.complete(this.token[i], CqFlag.READ, 0, 0);
      }
    }
    this.n = 0;
    for (const r of this.rails) r.deliver();
  }
}

class LoopRail implements Rail {
  readonly name: Uint8Array;
  readonly index = 0;
  readonly injectSize = 64;
  readonly maxMsgSize = 1 << 30;
  readonly cqDataBytes = 4;
  readonly rxCqData = false;
  private readonly peers: number[] = [];
  // Posted receives (a ring).
  readonly rxAddr = new Float64Array(Q);
  readonly rxToken = new Float64Array(Q);
  private rxHead = 0;
  private rxTail = 0;
  // Completions (reused objects).
  private readonly cq: Completion[] = Array.from({ length: Q }, () => ({ token: 0, status: 0, flags: 0, len: 0, imm: 0 }));
  private cqN = 0;
  private readonly batch: Completion[] = [];
  onCompletions: (rail: Rail, batch: readonly Completion[]) => void = () => {};
  private nextKey = 1;

  constructor(
    private readonly net: LoopNet,
    readonly id: number,
  ) {
    this.name = new Uint8Array([id]);
    net.rails.push(this);
  }

  insertPeer(name: Uint8Array): number {
    return this.peers.push(name[0]) - 1;
  }
  regMr(_addr: number, _len: number): Registration {
    const k = this.nextKey++;
    return { desc: k, key: BigInt(k), keyLo: k, keyHi: 0, remoteDelta: 0 };
  }
  deregMr(): void {}
  alloc(bytes: number): HostBuffer {
    const addr = this.net.alloc(bytes);
    return { addr, bytes: this.net.heap.subarray(addr - BASE, addr - BASE + bytes), reg: this.regMr(addr, bytes) };
  }
  free(): void {}
  postRecv(buf: HostBuffer, offset: number, _len: number, token: number): void {
    const i = this.rxTail++ % Q;
    this.rxAddr[i] = buf.addr + offset;
    this.rxToken[i] = token;
  }
  take(): number {
    if (this.rxHead === this.rxTail) throw new Error('no receive posted');
    return this.rxHead++ % Q;
  }
  send(peer: number, hi: number, lo: number, len: number, _d: number, imm: number, token: number): void {
    this.net.push(1, this.id, this.peers[peer], hi * ADDR_SPLIT + lo, len, 0, 0, 0, imm, token);
  }
  send2(peer: number, hi0: number, lo0: number, l0: number, _d0: number, hi1: number, lo1: number, l1: number, _d1: number, imm: number, token: number): void {
    this.net.push(1, this.id, this.peers[peer], hi0 * ADDR_SPLIT + lo0, l0, hi1 * ADDR_SPLIT + lo1, l1, 0, imm, token);
  }
  write(peer: number, hi: number, lo: number, len: number, _d: number, rhi: number, rlo: number, _kl: number, _kh: number, imm: number, token: number): void {
    this.net.push(2, this.id, this.peers[peer], hi * ADDR_SPLIT + lo, len, 0, 0, rhi * ADDR_SPLIT + rlo, imm, token);
  }
  read(peer: number, hi: number, lo: number, len: number, _d: number, rhi: number, rlo: number, _kl: number, _kh: number, token: number): void {
    this.net.push(3, this.id, this.peers[peer], hi * ADDR_SPLIT + lo, len, 0, 0, rhi * ADDR_SPLIT + rlo, -1, token);
  }
  complete(token: number, flags: number, len: number, imm: number): void {
    const c = this.cq[this.cqN++];
    c.token = token;
    c.flags = flags;
    c.len = len;
    c.imm = imm;
  }
  deliver(): void {
    for (let at = 0; at < this.cqN; at += 64) {
      const n = Math.min(64, this.cqN - at);
      this.batch.length = n;
      for (let i = 0; i < n; i++) this.batch[i] = this.cq[at + i];
      this.onCompletions(this, this.batch);
    }
    this.cqN = 0;
  }
}

function measure(label: string, size: number, group: number, eagerMax: number, total: number): number {
  const { msgs, ms } = exchange(size, group, eagerMax, total).run();
  console.log(`${label}: ${(msgs / ms / 1000).toFixed(2)} M messages/s, ${((ms * 1000) / msgs).toFixed(2)} us per message for sender and receiver together`);
  return msgs / (ms / 1000);
}

/** A connected pair over the lean fabric, warmed up; run() sends about `total` messages. */
function exchange(size: number, group: number, eagerMax: number, total: number) {
  const net = new LoopNet();
  const ra = new LoopRail(net, 0);
  const rb = new LoopRail(net, 1);
  const config = { ...OFI_DEFAULTS, eagerMax };
  const a = new OfiEndpoint([ra], { config });
  const b = new OfiEndpoint([rb], { config });
  ra.onCompletions = a.onCompletions;
  rb.onCompletions = b.onCompletions;
  const l = b.listen();
  const c = a.connect(l.handle);
  let sent = 0;
  let got = 0;
  net.pump();
  net.pump();
  const recv = l.accept(() => got++)!;
  const send = c.poll(() => sent++)!;
  const region = (rail: LoopRail): Region => {
    const hb = rail.alloc(1 << 20);
    return { id: 1, base: hb.addr, size: 1 << 20, bytes: hb.bytes, kind: 'host', regs: [hb.reg] };
  };
  const src = region(ra);
  const dst = region(rb);
  const room = Math.max(size, 65536);
  const bufs: ReqBuf[] = Array.from({ length: group }, (_, i) => ({ region: dst, offset: i * room, size: room, tag: i }));
  const sbuf: ReqBuf = { region: src, offset: 0, size, tag: 0 };
  const round = (n: number) => {
    for (let k = 0; k < 16; k++) {
      recv.irecv(n + k, bufs);
      for (let i = 0; i < group; i++) {
        sbuf.tag = i;
        send.isend(n + k, sbuf);
      }
    }
    while (got < n + 16 || sent < (n + 16) * group) net.pump();
  };
  const per = 16 * group;
  const warm = Math.ceil(2000 / per);
  for (let n = 0; n < warm; n++) round(n * 16);
  let next = warm;
  return {
    run() {
      const rounds = Math.ceil(total / per);
      const t = performance.now();
      for (let n = next; n < next + rounds; n++) round(n * 16);
      next += rounds;
      return { msgs: rounds * per, ms: performance.now() - t };
    },
  };
}

describe('protocol CPU per message (lean loopback fabric)', () => {
  it('eager, written and grouped messages', () => {
    const rates = [
      measure('eager 64 B', 64, 1, 8192, 100_000),
      measure('written 64 B (eager off)', 64, 1, -1, 100_000),
      measure('written 1 MiB', 1 << 20, 1, 8192, 2_000),
      measure('grouped 8 x 1 KiB eager', 1024, 8, 8192, 100_000),
      measure('grouped 8 x 1 KiB written', 1024, 8, -1, 100_000),
    ];
    for (const r of rates.slice(0, 2).concat(rates.slice(3))) expect(r).toBeGreaterThan(50_000);
  });
});

// Garbage makes young-generation collections, which stop a protocol thread for 0.2-1.2 ms each
// (docs/performance.md, item 18). Before item 18 an eager 64-byte message allocated about 100
// bytes here (a view per copy into its receive buffer), about 16 after.
describe('protocol garbage per message (lean loopback fabric)', () => {
  for (const [label, eagerMax, limit] of [['eager 64 B', 8192, 50], ['written 64 B (eager off)', -1, 40]] as const)
    it(`${label}: under ${limit} bytes per message in the plugin's code`, async () => {
      const x = exchange(64, 1, eagerMax, 20_000);
      x.run(); // compiled
      let msgs = 0;
      const a = await allocatedBy(() => {
        msgs = x.run().msgs;
      });
      const mine = a.sites.filter(([site]) => site.includes('plugin/')).reduce((t, [, b]) => t + b, 0);
      expect(mine / msgs, pluginSites(a, msgs).slice(0, 10).join('\n')).toBeLessThan(limit);
    });
});
