// Shared by the suites that drive the real native engine (build/tsnet_engine.node) from plain
// Node: loading it, memory whose address is known, connected socket pairs, polling loops,
// the plugin's log captured, byte patterns.
import * as fs from 'fs';
import * as net from 'net';
import * as path from 'path';
import type { LaneBinding } from '../../plugin/engine/native-link';
import { Port } from '../../plugin/engine/port';
import { KiB, MiB } from '../support/data';

export { KiB, MiB, allBytes, fill, firstDiff, prng } from '../support/data';

export const ROOT = path.resolve(__dirname, '../..');
// TSNET_TEST_ENGINE: another build of it (close-race.test.ts runs build/asan's in a child).
export const ADDON = process.env.TSNET_TEST_ENGINE ? path.resolve(process.env.TSNET_TEST_ENGINE) : path.join(ROOT, 'build/tsnet_engine.node');

/** build/tsnet_engine.node: the engine's functions plus the test-only helpers of standalone.cc. */
export interface EngineAddon extends LaneBinding {
  /** The plugin's clock as the binding gives it inside NCCL (plugin/clock.ts). */
  monoMs(): number;
  copyAscending(dst: Uint8Array, dstOffset: number, src: Uint8Array, srcOffset: number, len: number): void;
  setThread(index: number): void;
  setVerbose(on: boolean): void;
  ioTrace(on: boolean): void;
  ioStats(): Float64Array;
  ioWakes(): { count: number; sumUs: number; maxUs: number; buckets: number[] }[];
  ioSetSpin(us: number): void;
  /** Per I/O thread: passes in a busy-poll window that only another rail of its endpoints kept open; then per thread those only another endpoint's work did. */
  ioSpinShared(): Float64Array;
  addressOf(buffer: ArrayBuffer): number;
  socketPair(): [number, number];
  lanes(): number;
  noDelay(lane: number): number;
  ioStalls(thresholdMs: number): { thread: number; lane: number; ms: number; call: string }[];
  ioTestStall(thread: number, ms: number): void;
}

/** Why the engine suites cannot run, or undefined when the addon is built. */
export const missing = fs.existsSync(ADDON) ? undefined : `${path.relative(ROOT, ADDON)} is missing: run \`npm run build\` first`;

let addon: EngineAddon | undefined;

/** The addon, its I/O threads started (the first call in a process fixes their number). */
export function engine(ioThreads = 2, lingerMs = 2000): EngineAddon {
  if (!addon) {
    addon = require(ADDON) as EngineAddon;
    addon.setThread(0);
    addon.ioStart(ioThreads, 0, lingerMs, 50);
  }
  return addon;
}

/**
 * The addon as protocol thread `index` sees it: every call first makes the calling Node
 * thread play that index (setThread), so ports of several indices can be used in turn.
 */
export function bindingFor(index: number): EngineAddon {
  const a = engine();
  const wrap = <F extends (...args: never[]) => unknown>(f: F) =>
    ((...args: Parameters<F>) => {
      a.setThread(index);
      try {
        return f.apply(a, args);
      } finally {
        a.setThread(0);
      }
    }) as F;
  return { ...a, ioPort: wrap(a.ioPort), ioAdopt: wrap(a.ioAdopt), ioClose: wrap(a.ioClose), ioCancel: wrap(a.ioCancel), ioWake: wrap(a.ioWake), ioWriteNow: wrap(a.ioWriteNow!) };
}

const ports = new Map<number, Port>();

/** The port (rings) of protocol thread `index`, one per index per process. */
export function portOf(index = 0): Port {
  let p = ports.get(index);
  if (!p) ports.set(index, (p = new Port(bindingFor(index))));
  return p;
}

/** Memory whose address is known: an ArrayBuffer and a view of all of it. */
export class Mem {
  readonly buffer: ArrayBuffer;
  readonly bytes: Uint8Array;
  readonly addr: number;
  constructor(readonly size: number) {
    this.buffer = new ArrayBuffer(Math.max(size, 1));
    this.bytes = new Uint8Array(this.buffer, 0, size);
    this.addr = engine().addressOf(this.buffer);
  }
}

export const turn = () => new Promise<void>((r) => setImmediate(r));
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Turns the event loop (flushing and polling the ports) until cond() holds; fails naming what after ms. */
export async function until(cond: () => boolean, ms: number, what: string, polled: Port[] = [...ports.values()]): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    for (const p of polled) {
      p.flush();
      p.poll();
    }
    if (cond()) return;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await turn();
  }
}

/** Two connected TCP sockets on host (loopback), paused, nothing read by Node: hand their fds over, then destroy them. */
export function tcpPair(host = '127.0.0.1'): Promise<[net.Socket, net.Socket]> {
  return new Promise((resolve, reject) => {
    const server = net.createServer({ pauseOnConnect: true });
    server.on('error', reject);
    server.listen(0, host, () => {
      let accepted: net.Socket | undefined;
      let connected: net.Socket | undefined;
      const done = () => {
        if (!accepted || !connected) return;
        server.close();
        resolve([connected, accepted]);
      };
      server.once('connection', (s) => {
        accepted = s;
        done();
      });
      const c = net.connect({ port: (server.address() as net.AddressInfo).port, host });
      c.pause();
      c.on('error', reject);
      c.once('connect', () => {
        connected = c;
        done();
      });
    });
  });
}

/** The fd of a connected Node socket (Node keeps it on its handle). */
export function fdOf(s: net.Socket): number {
  const fd = (s as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw new Error('the socket has no fd');
  return fd;
}

/** Open file descriptors of this process. */
export const openFds = () => fs.readdirSync('/proc/self/fd').length;

