// Two Plugin instances in one Node process talking through the TCP transport over real
// loopback sockets: the handshake as NCCL drives it (listen, connect/accept retried until a
// comm), the data path through mailbox records, eager and striped messages, grouped
// receives, strangers on the listener's port, bad handles, and peers that close or vanish
// mid-transfer.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import * as os from 'node:os';
import { afterEach, describe, expect, it } from 'vitest';
import { LogLevel, ResultCode } from '../../plugin/abi';
import { Op } from '../../plugin/native';
import { Plugin } from '../../plugin/plugin';
import { HELLO_BYTES, Role, decodeHandle, encodeHandle, encodeHello } from '../../plugin/transports/tcp/wire';
import { KiB, MiB, captureLog, fill } from '../unit/helpers';

const log = captureLog();
const STRIDE = 4 + 4 * 8;
const HEAD = 4;
const IFACE = 'lo';
const BASE = { TSNET_TRANSPORT: 'tcp', NCCL_SOCKET_IFNAME: IFACE };

type Env = Record<string, string>;
type BufSpec = [mr: number, offset: number, size: number, tag: number];
interface Rec {
  op: number;
  comm: number;
  slot: number;
  bufs: BufSpec[];
}
interface Done {
  comm: number;
  slot: number;
  result: number;
  sizes: number[];
  at: number;
}

const turn = () => new Promise<void>((r) => setImmediate(r));
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Awaits event-loop turns until cond() holds; fails naming what after ms. */
async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await turn();
  }
}

function mailbox(recs: Rec[]): Float64Array {
  const m = new Float64Array((recs.length + 1) * STRIDE).fill(-7); // stale garbage around the records
  recs.forEach((r, k) => {
    const at = k * STRIDE;
    m.set([r.op, r.comm, r.slot, r.bufs.length], at);
    r.bufs.forEach((b, i) => m.set(b, at + HEAD + 4 * i));
  });
  return m;
}

const warnings = () => log.filter((l) => l.level === LogLevel.WARN).map((l) => l.msg);

// Everything a test opens, closed after it.
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) {
    try {
      c();
    } catch {
      // already gone
    }
  }
});

function side(env: Env) {
  const done: Done[] = [];
  const plugin = new Plugin((comm, slot, result, sizes) => done.push({ comm, slot, result, sizes: [...sizes], at: Date.now() }), undefined, env);
  const call = (op: string, args: Record<string, unknown> = {}) => plugin.control(op, args);
  const a = call('init', { commId: 1n, trafficClass: -1, legacy: false });
  expect(a.result ?? 0).toBe(0);
  const ctx = a.ctx as number;
  cleanups.push(() => call('finalize', { ctx }));
  const post = (...recs: Rec[]) => plugin.data(mailbox(recs), recs.length, STRIDE, HEAD);
  const reg = (comm: number, bytes: number) => {
    const buffer = new ArrayBuffer(bytes);
    const r = call('regMr', { comm, type: 1, buffer });
    expect(r.result ?? 0).toBe(0);
    return { mr: r.mr as number, bytes: new Uint8Array(buffer) };
  };
  const of = (comm: number, slot: number) => done.find((d) => d.comm === comm && d.slot === slot);
  return { plugin, done, call, post, reg, ctx, of };
}
type Side = ReturnType<typeof side>;

/** A handle as NCCL carries it: 128 bytes. */
function padded(h: Uint8Array): Uint8Array {
  const out = new Uint8Array(128);
  out.set(h);
  return out;
}

function listen(a: Side) {
  const l = a.call('listen', { ctx: a.ctx, dev: 0 });
  expect(l.result ?? 0).toBe(0);
  const handle = l.handle as Uint8Array;
  expect(handle.length).toBeLessThanOrEqual(128);
  return { listen: l.listen as number, handle: padded(handle) };
}

/** connect on b and accept on a, retried the way NCCL does until both give a comm. */
async function handshake(a: Side, b: Side, listenId: number, handle: Uint8Array, ms = 5000) {
  let send = 0;
  let recv = 0;
  const end = Date.now() + ms;
  while (!send || !recv) {
    if (!send) {
      const c = b.call('connect', { ctx: b.ctx, dev: 0, handle });
      expect(c.result ?? 0).toBe(0);
      send = c.comm as number;
    }
    if (!recv) {
      const r = a.call('accept', { listen: listenId });
      expect(r.result ?? 0).toBe(0);
      recv = r.comm as number;
    }
    if (Date.now() > end) throw new Error(`no comm after ${ms} ms (send ${send}, recv ${recv})`);
    await turn();
  }
  return { send, recv };
}

/** A receiving plugin a and a sending plugin b with one connection. */
async function connected(env: Env = {}) {
  const a = side({ ...BASE, ...env });
  const b = side({ ...BASE, ...env });
  const l = listen(a);
  const { send, recv } = await handshake(a, b, l.listen, l.handle);
  return { a, b, send, recv, ...l };
}
type Conn = Awaited<ReturnType<typeof connected>>;

const bytesEqual = (x: Uint8Array, y: Uint8Array) => Buffer.from(x.buffer, x.byteOffset, x.length).equals(Buffer.from(y.buffer, y.byteOffset, y.length));
const GUARD = 64;

/** Sends each size once (all in flight together), one receive per message, and checks every byte and the guards. */
async function transfer(c: Conn, sizes: number[], opts: { sendsFirst?: boolean; seed?: number; ms?: number } = {}) {
  const seed = opts.seed ?? 1;
  const base = 1000 + seed * 100;
  const msgs = sizes.map((size, i) => {
    const s = c.b.reg(c.send, Math.max(size, 1) + 8);
    fill(s.bytes.subarray(8, 8 + size), seed * 1000 + i);
    const r = c.a.reg(c.recv, size + 2 * GUARD);
    r.bytes.fill(0xee);
    return { size, s, r, slot: base + i };
  });
  const sends: Rec[] = msgs.map((m) => ({ op: Op.SEND, comm: c.send, slot: m.slot, bufs: [[m.s.mr, 8, m.size, 7]] }));
  const recvs: Rec[] = msgs.map((m) => ({ op: Op.RECV, comm: c.recv, slot: m.slot, bufs: [[m.r.mr, GUARD, m.size, 7]] }));
  if (opts.sendsFirst) {
    c.b.post(...sends);
    await turn();
    c.a.post(...recvs);
  } else {
    c.a.post(...recvs);
    c.b.post(...sends);
  }
  await until(
    () => msgs.every((m) => c.a.of(c.recv, m.slot) && c.b.of(c.send, m.slot)),
    opts.ms ?? 10_000,
    `${msgs.length} transfer(s) of ${sizes.join(', ')} bytes`,
  );
  for (const m of msgs) {
    expect(c.b.of(c.send, m.slot), `send of ${m.size}`).toMatchObject({ result: 0, sizes: [m.size] });
    expect(c.a.of(c.recv, m.slot), `recv of ${m.size}`).toMatchObject({ result: 0, sizes: [m.size] });
    expect(bytesEqual(m.r.bytes.subarray(GUARD, GUARD + m.size), m.s.bytes.subarray(8, 8 + m.size)), `bytes of ${m.size}`).toBe(true);
    expect(m.r.bytes.subarray(0, GUARD).every((x) => x === 0xee), `guard before ${m.size}`).toBe(true);
    expect(m.r.bytes.subarray(GUARD + m.size).every((x) => x === 0xee), `guard after ${m.size}`).toBe(true);
  }
  for (const m of msgs) {
    expect(c.a.call('deregMr', { mr: m.r.mr })).toEqual({});
    expect(c.b.call('deregMr', { mr: m.s.mr })).toEqual({});
  }
}

describe('tcp: connections', () => {
  it('one device on the chosen interface; the handle names its address, a port and a nonce', () => {
    const a = side(BASE);
    expect(a.call('devices')).toEqual({ ndev: 1 });
    const p = a.call('getProperties', { dev: 0 }).props as { name: string; speed: number; pciPath: string | null };
    expect(p.name).toBe(IFACE);
    expect(p.pciPath).toBeNull();
    expect(p.speed).toBeGreaterThan(0);
    const l1 = listen(a);
    const l2 = listen(a);
    const h1 = decodeHandle(l1.handle);
    const h2 = decodeHandle(l2.handle);
    expect(h1.rails).toHaveLength(1);
    expect(h1.rails[0].family).toBe(4);
    expect(h1.rails[0].address).toBe('127.0.0.1');
    expect(h1.rails[0].port).toBeGreaterThan(0);
    expect(h2.rails[0].port).not.toBe(h1.rails[0].port);
    expect(h1.nonce.equals(h2.nonce)).toBe(false);
  });

  it('connect and accept are non-blocking and complete through retries', async () => {
    const a = side(BASE);
    const b = side(BASE);
    const l = listen(a);
    // Before any turn of the event loop nothing can be up.
    expect(b.call('connect', { ctx: b.ctx, dev: 0, handle: l.handle })).toEqual({ comm: 0 });
    expect(a.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    const { send, recv } = await handshake(a, b, l.listen, l.handle);
    expect(send).toBeGreaterThan(0);
    expect(recv).toBeGreaterThan(0);
    // Nothing more to accept.
    expect(a.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    expect(warnings()).toEqual([]);
  });

  // Grey-box: Node keeps setNoDelay's state under the symbol kSetNoDelay; the sockets are
  // reached through the plugin's private comm table (comm -> engine -> link -> lanes -> sock).
  it('TCP_NODELAY is set on every socket of both ends (control and data)', async () => {
    const c = await connected({ TSNET_NSOCKS: '3' });
    const socketsOf = (p: Plugin, comm: number): net.Socket[] => {
      const link = (p as unknown as { comms: Map<number, { engine: { link: { control: { sock: net.Socket }; data: { sock: net.Socket }[] } } }> }).comms.get(comm)!.engine.link;
      return [link.control, ...link.data].map((l) => l.sock);
    };
    const socks = [...socketsOf(c.a.plugin, c.recv), ...socketsOf(c.b.plugin, c.send)];
    expect(socks).toHaveLength(8);
    for (const sock of socks) {
      expect(sock).toBeInstanceOf(net.Socket);
      const k = Object.getOwnPropertySymbols(sock).find((x) => x.description === 'kSetNoDelay');
      expect(k, 'Node keeps the no-delay state under kSetNoDelay').toBeDefined();
      expect((sock as unknown as Record<symbol, unknown>)[k!]).toBe(true);
    }
  });

  it('several comms through one listener, each its own stream', async () => {
    const a = side(BASE);
    const b = side(BASE);
    const l = listen(a);
    const c1 = await handshake(a, b, l.listen, l.handle);
    const c2 = await handshake(a, b, l.listen, l.handle);
    expect(c2.send).not.toBe(c1.send);
    expect(c2.recv).not.toBe(c1.recv);
    await transfer({ a, b, ...c1, ...l }, [1000], { seed: 1 });
    await transfer({ a, b, ...c2, ...l }, [200 * KiB], { seed: 2 });
  });

  it('closing the listen comm leaves the accepted comms working', async () => {
    const c = await connected();
    expect(c.a.call('closeListen', { listen: c.listen })).toEqual({});
    await transfer(c, [10, 1 * MiB]);
  });

  it('IPv6 over ::1 with NCCL_SOCKET_FAMILY=6', async () => {
    const c = await connected({ NCCL_SOCKET_FAMILY: '6' });
    const h = decodeHandle(c.handle);
    expect(h.rails[0].family).toBe(6);
    expect(new URL(`http://[${h.rails[0].address}]/`).hostname).toBe('[::1]');
    await transfer(c, [0, 100, 1 * MiB + 1]);
  });
});

const eth0v4 = (os.networkInterfaces().eth0 ?? []).find((a) => a.family === 'IPv4')?.address;

describe('tcp: a device of two NICs (TSNET_DEVICE_GROUPS)', () => {
  it.skipIf(!eth0v4)('lo+eth0: the handle names both rails, data sockets spread over both, bytes arrive intact', async () => {
    const env = { NCCL_SOCKET_IFNAME: '=lo,eth0', TSNET_DEVICE_GROUPS: 'lo+eth0', TSNET_NSOCKS: '4', TSNET_MIN_STRIPE: '4096' };
    const c = await connected(env);
    expect(c.a.call('devices')).toEqual({ ndev: 1 });
    const p = c.a.call('getProperties', { dev: 0 }).props as { name: string };
    expect(p.name).toBe('lo+eth0');
    const h = decodeHandle(c.handle);
    expect(h.rails.map((r) => r.address)).toEqual(['127.0.0.1', eth0v4]);
    expect(h.rails[0].port).toBe(h.rails[1].port);
    // Control + 4 data sockets, alternating rails: 3 on lo, 2 on eth0, each from its own NIC.
    const ss = spawnSync('ss', ['-Htn', 'state', 'established', `( dport = :${h.rails[0].port} )`], { encoding: 'utf8' });
    if (ss.status === 0) {
      const peers = ss.stdout.trim().split('\n').map((l) => l.trim().split(/\s+/).slice(-2));
      const on = (addr: string) => peers.filter(([local, peer]) => local.startsWith(`${addr}:`) && peer === `${addr}:${h.rails[0].port}`).length;
      expect([on('127.0.0.1'), on(eth0v4!)]).toEqual([3, 2]);
    }
    await transfer(c, [0, 10, 20 * KiB, 4 * MiB + 1, 16 * MiB]);
  });
});

describe('tcp: data', () => {
  it('sizes from 0 B to 64 MiB arrive intact, one at a time', async () => {
    const c = await connected();
    const sizes = [0, 1, 7, 4095, 4096, 16 * KiB - 1, 16 * KiB, 16 * KiB + 1, 64 * KiB, 128 * KiB + 5, 1 * MiB + 3, 8 * MiB, 64 * MiB];
    for (const [i, size] of sizes.entries()) await transfer(c, [size], { seed: i + 1 });
  });

  it('32 requests in flight, receives posted first', async () => {
    const c = await connected();
    const sizes = Array.from({ length: 32 }, (_, i) => [0, 3, 900, 16 * KiB, 40 * KiB + 1, 300 * KiB, 1 * MiB + 17][i % 7]);
    await transfer(c, sizes, { seed: 3 });
  });

  it('32 requests in flight, sends posted first', async () => {
    const c = await connected();
    const sizes = Array.from({ length: 32 }, (_, i) => [5, 256 * KiB + 9, 0, 17 * KiB, 2 * MiB][i % 5]);
    await transfer(c, sizes, { seed: 4, sendsFirst: true });
  });

  it('grouped receives of 8 with tags out of order, 20 rounds', async () => {
    const c = await connected();
    const N = 8;
    const sizeOf = (round: number, tag: number) => [0, 1, 1000, 16 * KiB, 16 * KiB + 1, 100 * KiB, 513 * KiB, 3][(tag + round) % N];
    const room = 600 * KiB;
    const s = c.b.reg(c.send, N * room);
    const r = c.a.reg(c.recv, N * room + GUARD);
    let slot = 1;
    for (let round = 0; round < 20; round++) {
      // Buffer i of the receive takes tag rtags[i]; messages go out in stags order.
      const rtags = Array.from({ length: N }, (_, i) => 100 + ((i * 3 + round) % N));
      const stags = Array.from({ length: N }, (_, i) => 100 + ((N - 1 - i + round * 5) % N));
      r.bytes.fill(0xee);
      for (const t of stags) fill(s.bytes.subarray((t - 100) * room, (t - 100) * room + sizeOf(round, t - 100)), round * 100 + t);
      const recvSlot = slot++;
      c.a.post({ op: Op.RECV, comm: c.recv, slot: recvSlot, bufs: rtags.map((t, i) => [r.mr, i * room, room, t] as BufSpec) });
      const sendSlots = stags.map((t) => ({ t, slot: slot++ }));
      c.b.post(...sendSlots.map(({ t, slot: sl }) => ({ op: Op.SEND, comm: c.send, slot: sl, bufs: [[s.mr, (t - 100) * room, sizeOf(round, t - 100), t]] as BufSpec[] })));
      await until(() => !!c.a.of(c.recv, recvSlot) && sendSlots.every((x) => c.b.of(c.send, x.slot)), 5000, `round ${round}`);
      const got = c.a.of(c.recv, recvSlot)!;
      expect(got.result, `round ${round}`).toBe(0);
      expect(got.sizes).toEqual(rtags.map((t) => sizeOf(round, t - 100)));
      for (const x of sendSlots) expect(c.b.of(c.send, x.slot)).toMatchObject({ result: 0, sizes: [sizeOf(round, x.t - 100)] });
      rtags.forEach((t, i) => {
        const size = sizeOf(round, t - 100);
        const want = s.bytes.subarray((t - 100) * room, (t - 100) * room + size);
        expect(bytesEqual(r.bytes.subarray(i * room, i * room + size), want), `round ${round} tag ${t}`).toBe(true);
        expect(r.bytes.subarray(i * room + size, (i + 1) * room).every((x) => x === 0xee), `round ${round} tag ${t} past its size`).toBe(true);
      });
    }
  });

  describe.each([
    ['0', '16384'],
    ['1', '0'],
    ['1', '65536'],
    ['4', '0'],
    ['4', '1048576'],
  ])('TSNET_NSOCKS=%s TSNET_EAGER_MAX=%s', (nsocks, eager) => {
    it('eager and striped sizes arrive intact', async () => {
      const c = await connected({ TSNET_NSOCKS: nsocks, TSNET_EAGER_MAX: eager, TSNET_MIN_STRIPE: '4096' });
      await transfer(c, [0, 1, 4096, 5000, 64 * KiB, 64 * KiB + 1, 1 * MiB, 3 * MiB + 1], { seed: Number(nsocks) + 7 });
      await transfer(c, Array.from({ length: 12 }, (_, i) => (i * 37 * KiB) % (700 * KiB)), { seed: 9 });
    });
  });

  it('the connector\'s schedule wins: peers with different TSNET_NSOCKS / TSNET_EAGER_MAX still agree', async () => {
    const a = side({ ...BASE, TSNET_NSOCKS: '1', TSNET_EAGER_MAX: '0' });
    const b = side({ ...BASE, TSNET_NSOCKS: '3', TSNET_EAGER_MAX: '65536', TSNET_MIN_STRIPE: '4096' });
    const l = listen(a);
    const { send, recv } = await handshake(a, b, l.listen, l.handle);
    await transfer({ a, b, send, recv, ...l }, [0, 10, 60 * KiB, 70 * KiB, 2 * MiB + 5]);
  });
});

describe('tcp: a send larger than its receive', () => {
  it.each([
    ['eager', 8 * KiB],
    ['striped', 1 * MiB],
    ['much larger, striped', 9 * MiB + 3],
  ])('%s: both sides fail with INVALID_USAGE, no byte lands past the receive', async (_kind, size) => {
    const c = await connected();
    const s = c.b.reg(c.send, size);
    fill(s.bytes, 5);
    const r = c.a.reg(c.recv, 64 * KiB);
    r.bytes.fill(0xee);
    c.a.post({ op: Op.RECV, comm: c.recv, slot: 1, bufs: [[r.mr, 4 * KiB, 4 * KiB, 3]] });
    c.b.post({ op: Op.SEND, comm: c.send, slot: 1, bufs: [[s.mr, 0, size, 3]] });
    await until(() => !!c.a.of(c.recv, 1) && !!c.b.of(c.send, 1), 5000, 'both sides to complete');
    expect(c.a.of(c.recv, 1)!.result).toBe(ResultCode.INVALID_USAGE);
    expect(c.b.of(c.send, 1)!.result).toBe(ResultCode.INVALID_USAGE);
    // Nothing outside [4 KiB, 8 KiB) of the region was written.
    expect(r.bytes.subarray(0, 4 * KiB).every((x) => x === 0xee)).toBe(true);
    expect(r.bytes.subarray(8 * KiB).every((x) => x === 0xee)).toBe(true);
    const w = warnings().join('\n');
    expect(w).toContain(String(size));
    expect(w).toContain(String(4 * KiB));
    // The stream stays in step: the next message arrives intact.
    await transfer(c, [100, 2 * MiB], { seed: 6 });
  });
});

describe('tcp: grouped receive with one message too large', () => {
  it('the receive and that send fail with INVALID_USAGE, the other sends succeed, nothing lands past a buffer', async () => {
    const c = await connected({ TSNET_MIN_STRIPE: '4096' });
    const room = 64 * KiB;
    const s = c.b.reg(c.send, 8 * 256 * KiB);
    fill(s.bytes, 11);
    const r = c.a.reg(c.recv, 8 * 2 * room);
    r.bytes.fill(0xee);
    // Buffer i at 2*i*room, room bytes each, tag 50+i; the message of tag 53 is 256 KiB.
    const sizeOf = (t: number) => (t === 53 ? 256 * KiB : 1000 * (t - 49));
    c.a.post({ op: Op.RECV, comm: c.recv, slot: 1, bufs: Array.from({ length: 8 }, (_, i) => [r.mr, 2 * i * room, room, 50 + i] as BufSpec) });
    const order = [57, 53, 50, 52, 56, 51, 55, 54];
    c.b.post(...order.map((t) => ({ op: Op.SEND, comm: c.send, slot: t, bufs: [[s.mr, (t - 50) * 256 * KiB, sizeOf(t), t]] as BufSpec[] })));
    await until(() => !!c.a.of(c.recv, 1) && order.every((t) => c.b.of(c.send, t)), 5000, 'all to complete');
    expect(c.a.of(c.recv, 1)!.result).toBe(ResultCode.INVALID_USAGE);
    for (const t of order) expect(c.b.of(c.send, t)!.result, `send tag ${t}`).toBe(t === 53 ? ResultCode.INVALID_USAGE : 0);
    for (let i = 0; i < 8; i++)
      expect(r.bytes.subarray((2 * i + 1) * room, (2 * i + 2) * room).every((x) => x === 0xee), `past buffer ${i}`).toBe(true);
    expect(warnings().join('\n')).toMatch(/262144.*65536|65536.*262144/);
  });
});

/** A raw TCP client on the listener's port. */
function stranger(port: number, host = '127.0.0.1') {
  const sock = net.connect({ port, host });
  sock.on('error', () => {});
  let ended = false;
  sock.on('close', () => (ended = true));
  cleanups.push(() => sock.destroy());
  return { sock, closed: () => ended };
}

describe('tcp: strangers on the listener port', () => {
  async function afterStranger(env: Env, act: (s: net.Socket, port: number, nonce: Buffer) => void, expectWarn: RegExp, ms = 3000) {
    const a = side({ ...BASE, ...env });
    const b = side({ ...BASE, ...env });
    const l = listen(a);
    const h = decodeHandle(l.handle);
    const st = stranger(h.rails[0].port);
    await new Promise<void>((res) => st.sock.once('connect', () => res()));
    act(st.sock, h.rails[0].port, h.nonce);
    await until(() => warnings().some((w) => expectWarn.test(w)), ms, `a WARN matching ${expectWarn}`);
    // The stranger got no comm and was hung up on.
    expect(a.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    await until(st.closed, 2000, 'the stranger to be disconnected');
    expect(a.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    // The listener still works.
    const { send, recv } = await handshake(a, b, l.listen, l.handle);
    await transfer({ a, b, send, recv, ...l }, [10, 300 * KiB]);
  }

  it('garbage bytes', async () => {
    await afterStranger({}, (s) => s.write(randomBytes(100)), /refused.*/);
  });

  it('a short garbage greeting, then close', async () => {
    await afterStranger({}, (s) => s.end(Buffer.from('GET / HTTP/1.0\r\n')), /refused.*closed before greeting/);
  });

  it('exactly 40 bytes of garbage', async () => {
    await afterStranger({}, (s) => s.write(Buffer.alloc(HELLO_BYTES, 0x41)), /refused.*bad magic/);
  });

  it('nothing, then close', async () => {
    await afterStranger({}, (s) => s.end(), /refused.*closed before greeting/);
  });

  it('nothing, connection kept open: dropped after TSNET_TIMEOUT_SEC', async () => {
    await afterStranger({ TSNET_TIMEOUT_SEC: '1' }, () => {}, /refused.*no greeting within/, 3000);
  });

  it('a silent stranger does not hold up a proper connect meanwhile', async () => {
    const a = side(BASE);
    const b = side(BASE);
    const l = listen(a);
    const st = stranger(decodeHandle(l.handle).rails[0].port);
    await new Promise<void>((res) => st.sock.once('connect', () => res()));
    const { send, recv } = await handshake(a, b, l.listen, l.handle, 2000);
    await transfer({ a, b, send, recv, ...l }, [1234]);
    expect(st.closed()).toBe(false);
  });

  it('a HELLO with a wrong nonce', async () => {
    const hello = (nonce: Buffer) =>
      encodeHello({ role: Role.CONTROL, lane: 0, nonce: Buffer.from(nonce.map((x) => x ^ 0xff)), connId: randomBytes(8), lanes: 0, eagerMax: 0, minStripe: 4096, status: 0 });
    await afterStranger({}, (s, _p, nonce) => s.write(hello(nonce)), /refused.*wrong nonce/);
  });

  it('a HELLO of another protocol version', async () => {
    await afterStranger(
      {},
      (s, _p, nonce) => {
        const b = encodeHello({ role: Role.CONTROL, lane: 0, nonce, connId: randomBytes(8), lanes: 0, eagerMax: 0, minStripe: 4096, status: 0 });
        b.writeUInt16LE(99, 4);
        s.write(b);
      },
      /refused.*protocol version 99/,
    );
  });

  it('a HELLO with the right nonce but the ACK role', async () => {
    await afterStranger(
      {},
      (s, _p, nonce) => s.write(encodeHello({ role: Role.ACK, lane: 0, nonce, connId: randomBytes(8), lanes: 0, eagerMax: 0, minStripe: 4096, status: 0 })),
      /refused.*bad greeting/,
    );
  });

  it('a control HELLO with the right nonce whose data sockets never come: dropped after TSNET_TIMEOUT_SEC', async () => {
    await afterStranger(
      { TSNET_TIMEOUT_SEC: '1' },
      (s, _p, nonce) => s.write(encodeHello({ role: Role.CONTROL, lane: 0, nonce, connId: randomBytes(8), lanes: 2, eagerMax: 0, minStripe: 4096, status: 0 })),
      /did not complete within 1000 ms/,
    );
  });

  it('a HELLO followed by more bytes', async () => {
    await afterStranger(
      {},
      (s, _p, nonce) =>
        s.write(Buffer.concat([encodeHello({ role: Role.CONTROL, lane: 0, nonce, connId: randomBytes(8), lanes: 0, eagerMax: 0, minStripe: 4096, status: 0 }), Buffer.alloc(24, 1)])),
      /refused.*unexpected bytes/,
    );
  });
});

describe('tcp: bad handles', () => {
  it.each([
    ['random bytes', () => new Uint8Array(randomBytes(128))],
    ['zeros', () => new Uint8Array(128)],
    [
      'a good magic and zero rails',
      () => {
        const h = new Uint8Array(encodeHandle({ nonce: randomBytes(8), rails: [{ family: 4, address: '127.0.0.1', port: 1 }] }));
        h[6] = 0;
        return padded(h);
      },
    ],
    [
      'a handle whose address is not an IP address',
      () => {
        const h = Buffer.from(encodeHandle({ nonce: randomBytes(8), rails: [{ family: 4, address: '127.0.0.1', port: 1 }] }));
        h.fill(0xff, 16 + 4, 16 + 20); // 255.255.255.255
        h[16] = 9;
        return padded(h);
      },
    ],
  ])('%s: connect answers an error at once', (_what, make) => {
    const b = side(BASE);
    const r = b.call('connect', { ctx: b.ctx, dev: 0, handle: make() });
    expect(r.result).toBeGreaterThan(0);
    expect(r.comm ?? 0).toBe(0);
    expect(warnings().some((w) => /connect/.test(w))).toBe(true);
  });

  async function connectFails(b: Side, handle: Uint8Array, ms: number) {
    let r: Record<string, unknown> = {};
    const t0 = Date.now();
    await until(
      () => {
        r = b.call('connect', { ctx: b.ctx, dev: 0, handle });
        return r.result !== undefined || (r.comm as number) > 0;
      },
      ms,
      'connect to answer',
    );
    expect(r.comm ?? 0).toBe(0);
    expect(r.result).toBeGreaterThan(0);
    return Date.now() - t0;
  }

  it('a handle naming a closed port: connect answers an error within seconds', async () => {
    const srv = net.createServer();
    await new Promise<void>((res) => srv.listen(0, '127.0.0.1', () => res()));
    const port = (srv.address() as net.AddressInfo).port;
    await new Promise<void>((res) => srv.close(() => res()));
    const b = side(BASE);
    await connectFails(b, padded(encodeHandle({ nonce: randomBytes(8), rails: [{ family: 4, address: '127.0.0.1', port }] })), 3000);
  });

  it('a handle with the right address but another nonce: connect fails, the listener warns and keeps working', async () => {
    const a = side(BASE);
    const b = side(BASE);
    const l = listen(a);
    const h = decodeHandle(l.handle);
    const wrong = padded(encodeHandle({ nonce: Buffer.from(h.nonce.map((x) => x ^ 1)), rails: h.rails }));
    await connectFails(b, wrong, 3000);
    expect(a.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    expect(warnings().some((w) => /refused.*wrong nonce/.test(w))).toBe(true);
    const c = await handshake(a, b, l.listen, l.handle);
    await transfer({ a, b, ...c, ...l }, [77]);
  });

  it('a handle naming port 0: connect answers an error', async () => {
    const b = side(BASE);
    await connectFails(b, padded(encodeHandle({ nonce: randomBytes(8), rails: [{ family: 4, address: '127.0.0.1', port: 0 }] })), 3000);
  });

  it('a handle naming an address nobody answers: connect answers an error within TSNET_TIMEOUT_SEC', async () => {
    const b = side({ ...BASE, TSNET_TIMEOUT_SEC: '1' });
    // TEST-NET-2 is not routed; on a host without a default route this fails at once instead.
    const ms = await connectFails(b, padded(encodeHandle({ nonce: randomBytes(8), rails: [{ family: 4, address: '198.51.100.7', port: 9 }] })), 3000);
    expect(ms).toBeLessThan(3000);
  });

  it('a handle of a closed listener: connect fails', async () => {
    const a = side(BASE);
    const b = side(BASE);
    const l = listen(a);
    expect(a.call('closeListen', { listen: l.listen })).toEqual({});
    await connectFails(b, l.handle, 3000);
  });
});

/** A TCP proxy on 127.0.0.1 in front of port: to freeze or cut connections under the plugins. */
async function proxy(port: number) {
  const pairs: { down: net.Socket; up: net.Socket }[] = [];
  const server = net.createServer((down) => {
    const up = net.connect({ port, host: '127.0.0.1' });
    down.on('error', () => {});
    up.on('error', () => {});
    down.pipe(up);
    up.pipe(down);
    pairs.push({ down, up });
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', () => res()));
  const destroyAll = () => pairs.forEach((p) => (p.down.destroy(), p.up.destroy()));
  cleanups.push(() => (destroyAll(), server.close()));
  return {
    port: (server.address() as net.AddressInfo).port,
    pairs,
    /** Stops forwarding in both directions; the sockets stay open (a host that vanished). */
    freeze: () =>
      pairs.forEach((p) => {
        p.down.unpipe(p.up);
        p.up.unpipe(p.down);
        p.down.pause();
        p.up.pause();
      }),
    /** Resets every connection (RST), both ways. */
    reset: () => pairs.forEach((p) => (p.down.resetAndDestroy(), p.up.resetAndDestroy())),
  };
}

/** a and b connected through a proxy. */
async function viaProxy(env: Env = {}) {
  const a = side({ ...BASE, ...env });
  const b = side({ ...BASE, ...env });
  const l = listen(a);
  const h = decodeHandle(l.handle);
  const px = await proxy(h.rails[0].port);
  const handle = padded(encodeHandle({ nonce: h.nonce, rails: [{ family: 4, address: '127.0.0.1', port: px.port }] }));
  const c = await handshake(a, b, l.listen, handle);
  return { a, b, ...c, ...l, px };
}

describe('tcp: peers that go away', () => {
  /** Posts one transfer of size and waits until some bytes have arrived. */
  async function midTransfer(c: Conn, size = 64 * MiB) {
    const s = c.b.reg(c.send, size);
    s.bytes.fill(1);
    const r = c.a.reg(c.recv, size);
    c.a.post({ op: Op.RECV, comm: c.recv, slot: 9, bufs: [[r.mr, 0, size, 0]] });
    c.b.post({ op: Op.SEND, comm: c.send, slot: 9, bufs: [[s.mr, 0, size, 0]] });
    await until(() => r.bytes.includes(1), 5000, 'the first bytes to arrive');
    expect(c.a.of(c.recv, 9)).toBeUndefined();
    return { s, r };
  }

  it('the sender\'s comm closed mid-transfer: the pending receive fails within seconds', async () => {
    const c = await connected();
    await midTransfer(c);
    const t0 = Date.now();
    expect(c.b.call('close', { comm: c.send })).toEqual({});
    await until(() => !!c.a.of(c.recv, 9), 3000, 'the receive to fail');
    expect(c.a.of(c.recv, 9)!.result).not.toBe(0);
    expect(Date.now() - t0).toBeLessThan(3000);
    // The closed side reports nothing more.
    await sleep(50);
    expect(c.b.done.filter((d) => d.comm === c.send)).toEqual([]);
    // Later requests on the surviving comm fail at once.
    c.a.post({ op: Op.RECV, comm: c.recv, slot: 10, bufs: [[0, 0, 0, 0]] });
    await until(() => !!c.a.of(c.recv, 10), 1000, 'a later receive to fail');
    expect(c.a.of(c.recv, 10)!.result).not.toBe(0);
  });

  it('the receiver\'s comm closed mid-transfer: the pending send fails within seconds', async () => {
    const c = await connected();
    await midTransfer(c);
    expect(c.a.call('close', { comm: c.recv })).toEqual({});
    await until(() => !!c.b.of(c.send, 9), 3000, 'the send to fail');
    expect(c.b.of(c.send, 9)!.result).not.toBe(0);
    await sleep(50);
    expect(c.a.done.filter((d) => d.comm === c.recv)).toEqual([]);
  });

  it('the receiver\'s comm closed with small sends waiting for their ACK: they fail', async () => {
    const c = await connected();
    const s = c.b.reg(c.send, 4096);
    // No receive posted: the sends are written but never matched.
    c.b.post(...[1, 2, 3].map((slot) => ({ op: Op.SEND, comm: c.send, slot, bufs: [[s.mr, 0, 100, 0]] as BufSpec[] })));
    await sleep(50);
    expect(c.b.done).toEqual([]);
    expect(c.a.call('close', { comm: c.recv })).toEqual({});
    await until(() => [1, 2, 3].every((sl) => c.b.of(c.send, sl)), 3000, 'the sends to fail');
    for (const sl of [1, 2, 3]) expect(c.b.of(c.send, sl)!.result).not.toBe(0);
  });

  it('connections reset under both plugins mid-transfer: both sides fail, no hang', async () => {
    const c = await viaProxy();
    await transfer(c, [5, 1 * MiB]);
    const { r } = await midTransfer(c);
    void r;
    c.px.reset();
    await until(() => !!c.a.of(c.recv, 9) && !!c.b.of(c.send, 9), 3000, 'both sides to fail');
    expect(c.a.of(c.recv, 9)!.result).not.toBe(0);
    expect(c.b.of(c.send, 9)!.result).not.toBe(0);
  });

  // BUG (plugin/config.ts:25 vs plugin/protocol/*, plugin/transports/tcp/*): TSNET_TIMEOUT_SEC is
  // documented as "seconds without progress on a link with work pending before it is declared
  // dead", but it is only used for the handshake (tcp/index.ts readHello / listener / connector
  // timers). Nothing watches an established link: no progress timer in Sender/Receiver/NodeLane,
  // no SO_KEEPALIVE / TCP_USER_TIMEOUT on the sockets. A peer host that vanishes without FIN/RST
  // (power loss, cable, frozen proxy here) leaves every pending request of both comms pending
  // forever: test() spins instead of returning an error.
  it('a peer that vanishes silently mid-transfer fails the pending requests after TSNET_TIMEOUT_SEC', async () => {
    const c = await viaProxy({ TSNET_TIMEOUT_SEC: '1' });
    await midTransfer(c);
    c.px.freeze();
    await until(() => !!c.a.of(c.recv, 9) && !!c.b.of(c.send, 9), 3500, 'both sides to fail after 1 s without progress');
    expect(c.a.of(c.recv, 9)!.result).not.toBe(0);
    expect(c.b.of(c.send, 9)!.result).not.toBe(0);
  });
});

describe('tcp: close with requests in flight', () => {
  it('closing both comms mid-transfer: no completion after close, no exception, regions free', async () => {
    const c = await connected();
    const size = 16 * MiB;
    const s = c.b.reg(c.send, size);
    const r = c.a.reg(c.recv, size);
    c.a.post(...[1, 2, 3, 4].map((slot) => ({ op: Op.RECV, comm: c.recv, slot, bufs: [[r.mr, (slot - 1) * 4 * MiB, 4 * MiB, 0]] as BufSpec[] })));
    c.b.post(...[1, 2, 3, 4].map((slot) => ({ op: Op.SEND, comm: c.send, slot, bufs: [[s.mr, (slot - 1) * 4 * MiB, 4 * MiB, 0]] as BufSpec[] })));
    await turn();
    const before = { a: c.a.done.length, b: c.b.done.length };
    expect(c.a.call('close', { comm: c.recv })).toEqual({});
    expect(c.b.call('close', { comm: c.send })).toEqual({});
    // Regions of a closed comm can be given back: nothing is in flight on them any more.
    expect(c.a.call('deregMr', { mr: r.mr })).toEqual({});
    expect(c.b.call('deregMr', { mr: s.mr })).toEqual({});
    r.bytes.fill(0x5a);
    await sleep(300);
    expect(c.a.done.length).toBe(before.a);
    expect(c.b.done.length).toBe(before.b);
    // Nobody wrote into the receive memory after close.
    expect(r.bytes.every((x) => x === 0x5a)).toBe(true);
    // Posting on a closed comm warns and completes nothing.
    c.b.post({ op: Op.SEND, comm: c.send, slot: 5, bufs: [[0, 0, 0, 0]] });
    await sleep(20);
    expect(c.b.done.length).toBe(before.b);
    expect(warnings().some((w) => new RegExp(`comm ${c.send}, which is closed`).test(w))).toBe(true);
  });

  it('closing the receiver right after posting, before a byte moved', async () => {
    const c = await connected();
    const s = c.b.reg(c.send, 1 * MiB);
    const r = c.a.reg(c.recv, 1 * MiB);
    r.bytes.fill(0x33);
    c.a.post({ op: Op.RECV, comm: c.recv, slot: 1, bufs: [[r.mr, 0, 1 * MiB, 0]] });
    c.b.post({ op: Op.SEND, comm: c.send, slot: 1, bufs: [[s.mr, 0, 1 * MiB, 0]] });
    expect(c.a.call('close', { comm: c.recv })).toEqual({});
    await until(() => !!c.b.of(c.send, 1), 3000, 'the send to fail');
    expect(c.b.of(c.send, 1)!.result).not.toBe(0);
    expect(c.a.done).toEqual([]);
    expect(r.bytes.every((x) => x === 0x33)).toBe(true);
  });

  it('finalize with comms, listeners and connects in flight', async () => {
    const c = await connected();
    const l2 = listen(c.a);
    // A connect still in progress on b.
    expect(c.b.call('connect', { ctx: c.b.ctx, dev: 0, handle: l2.handle })).toEqual({ comm: 0 });
    const s = c.b.reg(c.send, 4 * MiB);
    const r = c.a.reg(c.recv, 4 * MiB);
    c.a.post({ op: Op.RECV, comm: c.recv, slot: 1, bufs: [[r.mr, 0, 4 * MiB, 0]] });
    c.b.post({ op: Op.SEND, comm: c.send, slot: 1, bufs: [[s.mr, 0, 4 * MiB, 0]] });
    expect(c.a.call('finalize', { ctx: c.a.ctx })).toEqual({});
    expect(c.b.call('finalize', { ctx: c.b.ctx })).toEqual({});
    await sleep(200);
    expect(c.a.done).toEqual([]);
    expect(c.b.done).toEqual([]);
  });
});
