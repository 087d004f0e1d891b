// Two (or more) hosts on a fake fabric, each with an OfiEndpoint over its NICs, and the helpers
// the scenario tests share: connect, post, run the random scheduler until a condition holds,
// and check after every step that bounce-buffer accounting is exact on both sides.
import { expect } from 'vitest';
import { BOUNCE_TOKEN } from '../../plugin/transports/ofi/bounce';
import { OFI_DEFAULTS, type OfiConfig } from '../../plugin/transports/ofi/config';
import { OfiEndpoint } from '../../plugin/transports/ofi/endpoint';
import type { Complete, RecvComm, Region, ReqBuf, SendComm } from '../../plugin/transports/ofi/fabric';
import type { ProcStat } from '../../plugin/transports/ofi/peer-process';
import { FakeFabric, type FakeHost, type FakeOptions, rng } from './fake-fabric';

export interface WorldOptions {
  seed?: number;
  fake?: FakeOptions;
  config?: Partial<OfiConfig>;
  /** NICs of host a (the sender) and host b (the receiver). */
  nicsA?: number;
  nicsB?: number;
  maxComms?: number;
  timeoutMs?: number;
  /** Check the accounting invariant after every step (default true). */
  check?: boolean;
  /** Give each endpoint a device-memory flush line (write-then-read flushes use it). */
  flushScratch?: boolean;
  /** EndpointOptions.gpuEager of both endpoints (default true). */
  gpuEager?: boolean;
  /**
   * Every peer on this host (EndpointOptions.watchPeers), each side reading its /proc through
   * this (side name → ProcStat); side i's own pid is 1000 + i.
   */
  procStat?: (side: string) => ProcStat;
  /** With procStat: each side's kernel boot id (default: the same for both, one host). */
  bootId?: (side: string) => Uint8Array;
}

export interface Done {
  code: number;
  sizes: number[];
}

export class Side {
  readonly done = new Map<number, Done>();
  /** Completions in the order they came. */
  readonly order: number[] = [];
  readonly complete: Complete = (slot, code, sizes) => {
    if (this.done.has(slot)) throw new Error(`${this.host.name}: slot ${slot} completed twice`);
    this.done.set(slot, { code, sizes: Array.from(sizes) });
    this.order.push(slot);
  };

  constructor(
    readonly world: World,
    readonly host: FakeHost,
    readonly ep: OfiEndpoint,
  ) {}

  region(size: number, kind: 'host' | 'cuda' = 'host', ipc = false, device = 0): Region {
    return this.world.fabric.region(this.host, size, kind, 1, ipc, device);
  }

  has(...slots: number[]): boolean {
    return slots.every((s) => this.done.has(s));
  }

  take(slot: number): Done {
    const d = this.done.get(slot);
    if (!d) throw new Error(`${this.host.name}: slot ${slot} did not complete`);
    this.done.delete(slot);
    return d;
  }

  /** Bounce-buffer accounting: the endpoint's own check and what the fake sees posted. */
  check(): void {
    const why = this.ep.check();
    if (why) throw new Error(`${this.host.name}: ${why}`);
    if (this.host.dead) return;
    this.host.rails.forEach((r, i) => {
      // Posted at the NIC, or consumed with the completion not yet read: what the pool counts as posted.
      const a = this.ep.pool.accounts[i];
      const unread = r.cq.reduce((n, c) => n + (c.token >= BOUNCE_TOKEN ? 1 : 0), 0);
      if (r.posted.length + unread !== a.posted)
        throw new Error(`${this.host.name} rail ${i}: ${r.posted.length} receives posted and ${unread} completed unread at the NIC; the pool counts ${a.posted}`);
    });
  }
}

export class World {
  readonly fabric: FakeFabric;
  now = 1_000_000;
  readonly a: Side;
  readonly b: Side;
  readonly sides: Side[] = [];
  readonly random: () => number;
  private readonly checkSteps: boolean;

  constructor(readonly opts: WorldOptions = {}) {
    const seed = opts.seed ?? 1;
    this.fabric = new FakeFabric({ seed, ...opts.fake });
    this.random = rng(seed * 7 + 3);
    this.checkSteps = opts.check ?? true;
    this.a = this.side('a', opts.nicsA ?? 1);
    this.b = this.side('b', opts.nicsB ?? opts.nicsA ?? 1);
  }

  side(name: string, nics: number): Side {
    const host = this.fabric.host(name, nics);
    const config: OfiConfig = { ...OFI_DEFAULTS, ...this.opts.config };
    const ep = new OfiEndpoint(host.rails, {
      config,
      name,
      clock: () => this.now,
      random: () => (this.random() * 2 ** 32) >>> 0,
      timeoutMs: this.opts.timeoutMs ?? 10_000,
      maxComms: this.opts.maxComms,
      flushScratch: this.opts.flushScratch ? this.fabric.region(host, 64 * nics, 'cuda', 999) : null,
      gpuEager: this.opts.gpuEager,
      pid: 1000 + this.sides.length, // each fake host is its own process
      watchPeers: !!this.opts.procStat,
      procStat: this.opts.procStat?.(name),
      bootId: this.opts.bootId?.(name) ?? new Uint8Array(16).fill(7),
    });
    for (const r of host.rails) r.onCompletions = ep.onCompletions;
    const s = new Side(this, host, ep);
    this.sides.push(s);
    return s;
  }

  /** Runs the scheduler until cond holds; fails the test when nothing can progress. */
  run(cond: () => boolean, what = 'the condition', maxSteps = 2_000_000): void {
    const ok = this.fabric.run(cond, maxSteps, this.checkSteps ? () => this.check() : undefined);
    if (!ok) throw new Error(`${what} never held (fabric quiescent after ${this.fabric.steps} steps, ${this.fabric.ops.length} operations blocked)`);
  }

  /** Runs until nothing can progress. */
  settle(): void {
    this.fabric.run(() => false, 5_000_000, this.checkSteps ? () => this.check() : undefined);
  }

  check(): void {
    for (const s of this.sides) s.check();
  }

  /** A send comm on from and the receive comm on to that it connected to. */
  connect(from: Side = this.a, to: Side = this.b): { send: SendComm; recv: RecvComm } {
    const listener = to.ep.listen();
    const connector = from.ep.connect(listener.handle);
    let send: SendComm | undefined;
    let recv: RecvComm | undefined;
    this.run(() => {
      send ??= connector.poll(from.complete);
      recv ??= listener.accept(to.complete);
      return !!send && !!recv;
    }, 'connect');
    listener.close();
    return { send: send!, recv: recv! };
  }

  /** Advances the fake clock and ticks every endpoint. */
  advance(ms: number): void {
    this.now += ms;
    for (const s of this.sides) if (!s.host.dead) s.ep.tick(this.now);
  }
}

/** Deterministic bytes for a message. */
export function pattern(seed: number, len: number): Uint8Array {
  const r = rng(seed);
  const b = new Uint8Array(len);
  for (let i = 0; i < len; i++) b[i] = (r() * 256) | 0;
  return b;
}

export const buf = (region: Region | null, offset: number, size: number, tag: number): ReqBuf => ({ region, offset, size, tag });

/** Expects dst[offset, offset+want.length) to hold want, and (guard) the byte after to be untouched. */
export function expectBytes(dst: Uint8Array, offset: number, want: Uint8Array): void {
  const got = dst.subarray(offset, offset + want.length);
  let bad = -1;
  for (let i = 0; i < want.length; i++)
    if (got[i] !== want[i]) {
      bad = i;
      break;
    }
  expect(bad, `first differing byte at ${bad} of ${want.length}`).toBe(-1);
}
