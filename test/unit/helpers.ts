// Shared helpers of the unit suites: settling the event loop, capturing the plugin's log,
// byte patterns, and a sender/receiver pair over a real loopback link.
import { afterEach, beforeEach } from 'vitest';
import { type Config, readConfig } from '../../plugin/config';
import { setLogSink } from '../../plugin/log';
import { Receiver, type RecvBuf } from '../../plugin/protocol/receiver';
import { Sender } from '../../plugin/protocol/sender';
import type { Done, Lane, Link } from '../../plugin/transports/lane';
import { LoopbackTransport } from '../../plugin/transports/loopback';

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * Awaits macrotask turns (each also drains the microtask queue) until probe() gives the
 * same value on 3 turns in a row. probe defaults to nothing changes at all (a few turns).
 */
export async function settle(probe: () => unknown = () => 0, maxTurns = 10_000): Promise<void> {
  let last = JSON.stringify(probe());
  let same = 0;
  for (let i = 0; i < maxTurns && same < 3; i++) {
    await turn();
    const now = JSON.stringify(probe());
    same = now === last ? same + 1 : 0;
    last = now;
  }
}

export interface LogLine {
  level: number;
  flags: number;
  msg: string;
}

/** Captures every log line of the plugin for the tests of the calling file (no stderr noise). */
export function captureLog(): LogLine[] {
  const lines: LogLine[] = [];
  beforeEach(() => {
    lines.length = 0;
    setLogSink((level, flags, msg) => lines.push({ level, flags, msg }), true);
  });
  afterEach(() => setLogSink(() => {}));
  return lines;
}

/** A deterministic byte pattern, different for each seed. */
export function fill(view: Uint8Array, seed: number): Uint8Array {
  let x = (seed * 2654435761 + 12345) >>> 0;
  for (let i = 0; i < view.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    view[i] = x >>> 24;
  }
  return view;
}

/** Index of the first byte where a and b differ, -1 when equal (lengths must match). */
export function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/** True when every byte of v is value. */
export const allBytes = (v: Uint8Array, value: number) => v.every((b) => b === value);

export interface Completion {
  slot: number;
  code: number;
  sizes: number[];
}

/** Bytes a lane has been asked to write. */
export interface Counted extends Lane {
  written: number;
  writes: number;
}

function countLane(lane: Lane): Counted {
  const c: Counted = {
    written: 0,
    writes: 0,
    write(views: Uint8Array[], done: Done) {
      c.writes++;
      c.written += views.reduce((n, v) => n + v.length, 0);
      lane.write(views, done);
    },
    read: (view, done) => lane.read(view, done),
    close: () => lane.close(),
  };
  return c;
}

/** A Link whose lanes count the bytes written through them. */
export interface CountingLink extends Link {
  readonly control: Counted;
  readonly data: readonly Counted[];
}

export function countingLink(link: Link): CountingLink {
  return {
    control: countLane(link.control),
    data: link.data.map(countLane),
    onFail: (cb) => link.onFail(cb),
    close: () => link.close(),
    description: link.description,
  };
}

export interface Pair {
  config: Config;
  transport: LoopbackTransport;
  sender: Sender;
  receiver: Receiver;
  /** The sender's link, counting bytes per lane. */
  sendLink: CountingLink;
  recvLink: Link;
  sent: Completion[];
  received: Completion[];
  /** Settles until neither side reports anything new. */
  settle(): Promise<void>;
}

/** A Sender and a Receiver over one loopback link, configured by env (TSNET_TRANSPORT=loopback implied). */
export function pair(env: Record<string, string | undefined> = {}): Pair {
  const { config } = readConfig({ TSNET_TRANSPORT: 'loopback', ...env });
  const transport = new LoopbackTransport(config);
  const listener = transport.listen(0);
  const raw = transport.connect(0, listener.handle).poll();
  const recvLink = listener.accept();
  if (!raw || !recvLink) throw new Error('loopback connect/accept did not give links');
  const sendLink = countingLink(raw);
  const sent: Completion[] = [];
  const received: Completion[] = [];
  const sender = new Sender(sendLink, transport.policy, (slot, code, sizes) => sent.push({ slot, code, sizes: [...sizes] }), 'test');
  const receiver = new Receiver(recvLink, transport.policy, (slot, code, sizes) => received.push({ slot, code, sizes: [...sizes] }), 'test');
  return {
    config,
    transport,
    sender,
    receiver,
    sendLink,
    recvLink,
    sent,
    received,
    settle: () => settle(() => [sent.length, received.length]),
  };
}

/** A receive buffer over view. */
export const buf = (view: Uint8Array, tag = 0): RecvBuf => ({ view, size: view.length, tag });

export const KiB = 1024;
export const MiB = 1024 * KiB;
