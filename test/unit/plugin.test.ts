// The Plugin behind the core API with a fake PluginHost, driven the way the native core drives
// it: control calls (init, devices, getProperties, listen/connect/accept/attach, regMr/deregMr,
// close, closeListen, finalize, setNetAttr), posted requests as mailbox records handed over by
// turn(), completions read from the slot-status array the test attached; deregMr, close and
// finalize with requests in flight; TSNET_STATS lines; the TSNET_TRACE file.
import { describe, expect, it, vi } from 'vitest';
import { LogLevel, ResultCode } from '../../plugin/abi';
import type { Config } from '../../plugin/config';
import { POST, SLOT, SlotState } from '../../plugin/engine/records';
import type { DmaBuf, Region, Regions } from '../../plugin/memory';
import { Op } from '../../plugin/native';
import { IDLE_COLLECT_MS, Plugin, type PluginHost } from '../../plugin/plugin';
import type { WakeDelays } from '../../plugin/stats';
import { LoopbackTransport } from '../../plugin/transports/loopback';
import { KiB, MiB, allBytes, captureLog, fill, firstDiff, settle } from './helpers';

const log = captureLog();
const warnings = () => log.filter((l) => l.level === LogLevel.WARN).map((l) => l.msg);
const infos = () => log.filter((l) => l.level === LogLevel.INFO).map((l) => l.msg);

const MAX_BUFS = 8;
const STRIDE = POST.head + POST.buf * MAX_BUFS;
const SLOTS = 256;
const RECORDS = 64;
const LOOP = { TSNET_TRANSPORT: 'loopback' };

/** The host the native binding is to the plugin, as fakes that record what they were asked. */
class FakeHost implements PluginHost {
  readonly mailbox = new Float64Array(STRIDE * RECORDS).fill(-7); // stale garbage around the records
  readonly recordStride = STRIDE;
  readonly slotsPerComm = SLOTS;
  readonly started: number[] = [];
  readonly spins: number[] = [];
  readonly ioSpins: number[] = [];
  /** What wakes() and ioWakes() answer when set (else the fixed figures below). */
  ownWakes: WakeDelays | undefined;
  ioWakesNow: WakeDelays[] | undefined;
  readonly transports: LoopbackTransport[] = [];
  readonly traceFiles: string[] = [];
  readonly traceWrites: string[] = [];
  traceOk = true;
  timestamped = 0;
  /** What wakeState() answers (undefined: the method answers as the native one would with nothing waiting). */
  wake: ReturnType<NonNullable<PluginHost['wakeState']>> | undefined;
  cpu = 0;
  busyUs = 0;
  clock = 5_000_000;

  constructor(readonly thread = 0) {}

  startThreads(n: number): void {
    this.started.push(n);
  }
  setSpin(us: number): void {
    this.spins.push(us);
  }
  makeTransport(config: Config, regions: Regions): LoopbackTransport {
    const t = new LoopbackTransport(config, regions);
    this.transports.push(t);
    return t;
  }
  threadCpu(): number {
    return this.cpu;
  }
  busy(): number {
    return this.busyUs;
  }
  ioCpu(): number[] {
    return [1.5e6, 2.25e6];
  }
  processCpu(): { threads: { name: string; us: number }[]; processUs?: number } {
    return { threads: [{ name: 'tsnet-plugin', us: 1e6 }, { name: 'tsnet-io0', us: 1.5e6 }, { name: 'app', us: 4e6 }], processUs: 9e6 };
  }
  ioSetSpin(us: number): void {
    this.ioSpins.push(us);
  }
  ioWakes(): WakeDelays[] {
    if (this.ioWakesNow) return this.ioWakesNow;
    return [
      { count: 3, sumUs: 30, maxUs: 14, buckets: [0, 1, 1, 1] },
      { count: 1, sumUs: 2500, maxUs: 2500, buckets: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1] },
    ];
  }
  wakes(): WakeDelays {
    if (this.ownWakes) return this.ownWakes;
    return this.thread === 0 ? { count: 4, sumUs: 8, maxUs: 3, buckets: [3, 1] } : { count: 0, sumUs: 0, maxUs: 0, buckets: [] };
  }
  traceOpen(path: string): boolean {
    this.traceFiles.push(path);
    return this.traceOk;
  }
  traceWrite(text: string): void {
    this.traceWrites.push(text);
  }
  now(): number {
    return this.clock;
  }
  timestamps(): void {
    this.timestamped++;
  }
  wakeState() {
    return this.wake ?? { work: false, pending: false, readable: false, spinning: false, sinceTurnMs: 0 };
  }
  selfWakes = 0;
  wakeSelf(): void {
    this.selfWakes++;
  }
  /** The trace file as the native traceWrite leaves it ("[\n", writes joined by ",\n"), closed with "]". */
  traceJson(): TraceEvent[] {
    return JSON.parse(`[\n${this.traceWrites.join(',\n')}]`);
  }
}

interface TraceEvent {
  ph: string;
  name?: string;
  cat?: string;
  id?: number;
  pid: number;
  tid: number;
  ts?: number;
  args?: Record<string, unknown>;
}

type BufSpec = [mr: number, offset: number, size: number, tag: number];

/** A posted request as the core writes it into the mailbox. */
interface Rec {
  op: number;
  comm: number;
  slot: number;
  bufs: BufSpec[];
  postedUs?: number;
  takenUs?: number;
  /** Posted by the warm-up at init (the record's mark). */
  warmup?: boolean;
  /** Leave the slot's state alone (the core always sets POSTED first). */
  unposted?: boolean;
}

interface SlotView {
  state: number;
  result: number;
  sizes: number[];
}

function setup(env: Record<string, string> = LOOP, thread = 0) {
  const host = new FakeHost(thread);
  const plugin = new Plugin(host, env);
  const call = (op: string, args: Record<string, unknown> = {}) => plugin.control(op, args);
  const statuses = new Map<number, Int32Array>();
  let nextRegion = 1;

  const init = (commId = 1n) => {
    const a = call('init', { commId, trafficClass: -1, legacy: false });
    expect(a.result ?? 0).toBe(0);
    return a.ctx as number;
  };
  /** attach as the core does after connect/accept: the comm's slot-status memory. */
  const attach = (comm: number) => {
    const buf = new ArrayBuffer(SLOTS * SLOT.ints * 4);
    statuses.set(comm, new Int32Array(buf));
    expect(call('attach', { comm, status: buf })).toEqual({});
    return new Int32Array(buf);
  };
  /** listen, connect, accept and attach on dev: the send and receive comms. */
  const connect = (ctx: number, dev = 0) => {
    const l = call('listen', { ctx, dev });
    expect(l.result ?? 0).toBe(0);
    const send = call('connect', { ctx, dev, handle: l.handle }).comm as number;
    const recv = call('accept', { listen: l.listen }).comm as number;
    expect(send).toBeGreaterThan(0);
    expect(recv).toBeGreaterThan(0);
    attach(send);
    attach(recv);
    return { send, recv, listen: l.listen as number, handle: l.handle as Uint8Array };
  };
  /** regMr of bytes of host memory at a fake address. */
  const reg = (comm: number, bytes: number) => {
    const buffer = new ArrayBuffer(bytes);
    const base = 0x1000_0000 * nextRegion++;
    const a = call('regMr', { comm, type: 1, buffer, base });
    expect(a.result ?? 0).toBe(0);
    return { mr: a.mr as number, bytes: new Uint8Array(buffer), base };
  };
  /** Writes the records into the mailbox, marks their slots POSTED and runs a turn. */
  const post = (...recs: Rec[]) => {
    const m = host.mailbox;
    m.fill(-7);
    recs.forEach((r, k) => {
      const at = k * STRIDE;
      m.set([r.op, r.comm, r.slot, r.bufs.length, r.postedUs ?? 0, r.takenUs ?? 0, r.warmup ? 1 : 0], at);
      r.bufs.forEach((b, i) => m.set(b, at + POST.head + POST.buf * i));
      const st = statuses.get(r.comm);
      if (st && !r.unposted) Atomics.store(st, r.slot * SLOT.ints + SLOT.state, SlotState.POSTED);
    });
    plugin.turn(recs.length);
  };
  /** A slot's state, result and first n sizes. */
  const slot = (comm: number, s: number, n = 1): SlotView => {
    const st = statuses.get(comm)!;
    const b = s * SLOT.ints;
    return { state: Atomics.load(st, b + SLOT.state), result: st[b + SLOT.result], sizes: Array.from(st.subarray(b + SLOT.sizes, b + SLOT.sizes + n)) };
  };
  const snapshot = () => [...statuses.values()].map((st) => st.join(',')).join('|');
  return { host, plugin, call, init, attach, connect, reg, post, slot, statuses, settle: () => settle(snapshot) };
}

const done = (...sizes: number[]): SlotView => ({ state: SlotState.DONE, result: ResultCode.SUCCESS, sizes });
const failed = (result: ResultCode, ...sizes: number[]): SlotView => ({ state: SlotState.FAILED, result, sizes });
const POSTED = { state: SlotState.POSTED, result: 0, sizes: [0] };

describe('Plugin control calls', () => {
  it('init reads the configuration once, logs it, makes the transport and sets the busy-poll window', () => {
    const t = setup({ ...LOOP, TSNET_NSOCKS: '2', TSNET_SPIN_US: '7' });
    const a = t.call('init', { commId: 0xabcn, trafficClass: -1, legacy: false });
    // the first init's answer asks the core for the warm-up (TSNET_WARMUP), later ones for none
    expect(a).toEqual({ ctx: expect.any(Number), warmup: 10000 });
    const b = t.call('init', { commId: 2n, trafficClass: -1, legacy: true });
    expect(b.ctx).not.toBe(a.ctx);
    expect(b.warmup).toBe(0);
    expect(infos().filter((m) => m === 'config: data sockets per comm = 2 (TSNET_NSOCKS)').length).toBe(1);
    expect(infos().filter((m) => m.startsWith('config: ')).length).toBeGreaterThan(5);
    expect(infos()).toContain('transport loopback, 1 device(s), 1 protocol thread(s)');
    expect(infos()).toContain(`context ${a.ctx} for communicator 0xabc`);
    expect(infos()).toContain(`context ${b.ctx}: the process-wide context of ncclNet v6-v10`);
    expect(t.host.transports.length).toBe(1);
    expect(t.host.spins).toEqual([7]);
    expect(t.host.started).toEqual([]);
  });

  it('init answers TSNET_WARMUP once: the count at the first init, 0 at later ones and with TSNET_WARMUP=0', () => {
    const t = setup({ ...LOOP, TSNET_WARMUP: '50' });
    expect(t.call('init', { commId: 1n, trafficClass: -1, legacy: false }).warmup).toBe(50);
    expect(t.call('init', { commId: 2n, trafficClass: -1, legacy: false }).warmup).toBe(0);
    const off = setup({ ...LOOP, TSNET_WARMUP: '0' });
    expect(off.call('init', { commId: 1n, trafficClass: -1, legacy: false }).warmup).toBe(0);
  });

  it('thread 0 starts the other protocol threads once, at the first init', () => {
    const t = setup({ TSNET_PROTOCOL_THREADS: '3' });
    t.init();
    t.init(2n);
    expect(t.host.started).toEqual([3]);
    expect(infos()).toContain('transport loopback, 1 device(s), 3 protocol thread(s)');
    // Loopback links live in one thread: none started.
    const loop = setup({ ...LOOP, TSNET_PROTOCOL_THREADS: '3' });
    loop.init();
    expect(loop.host.started).toEqual([]);
  });

  it('another protocol thread starts at its first call (no init), logs no configuration and starts no threads', () => {
    const t = setup({ TSNET_PROTOCOL_THREADS: '3' }, 1);
    expect(t.call('devices')).toEqual({ ndev: 1 });
    const l = t.call('listen', { ctx: 77, dev: 0 });
    expect(l).toEqual({ listen: expect.any(Number), handle: expect.any(Uint8Array) });
    expect(t.host.started).toEqual([]);
    expect(t.host.transports.length).toBe(1);
    expect(infos().filter((m) => m.startsWith('config: ') || m.startsWith('transport '))).toEqual([]);
  });

  it('ids are unique in the process: protocol thread k hands out k+1, k+1+16, ...', () => {
    for (const thread of [0, 1, 15]) {
      const t = setup(LOOP, thread);
      const ids = [t.call('listen', { ctx: 99, dev: 0 }).listen, t.call('listen', { ctx: 99, dev: 0 }).listen];
      const l = t.call('listen', { ctx: 99, dev: 0 });
      ids.push(l.listen, t.call('connect', { ctx: 99, dev: 0, handle: l.handle }).comm, t.call('accept', { listen: l.listen }).comm);
      expect(ids).toEqual([0, 1, 2, 3, 4].map((k) => thread + 1 + 16 * k));
    }
  });

  it('a bad variable fails init with INVALID_ARGUMENT and a WARN naming it', () => {
    const t = setup({ ...LOOP, TSNET_EAGER_MAX: 'lots' });
    expect(t.call('init', { commId: 1n, trafficClass: -1, legacy: false })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings()).toEqual(['init: TSNET_EAGER_MAX=lots: expected an integer']);
    expect(t.host.transports).toEqual([]);
  });

  it.each(['frobnicate', '', 'constructor', 'toString', '__proto__', 'hasOwnProperty'])('the unknown control call %j is INTERNAL_ERROR with a WARN', (op) => {
    const t = setup();
    t.init();
    expect(t.call(op, {})).toEqual({ result: ResultCode.INTERNAL_ERROR });
    expect(warnings()).toEqual([`${op}: unknown control call ${op}`]);
  });

  it('devices counts the loopback devices', () => {
    const one = setup();
    one.init();
    expect(one.call('devices')).toEqual({ ndev: 1 });
    const three = setup({ ...LOOP, TSNET_LOOPBACK_DEVICES: '3' });
    three.init();
    expect(three.call('devices')).toEqual({ ndev: 3 });
  });

  it('getProperties gives every member of NetProperties, a distinct guid per device, stable across instances', () => {
    const t = setup({ ...LOOP, TSNET_LOOPBACK_DEVICES: '3' });
    t.init();
    const guids: bigint[] = [];
    for (const dev of [0, 1, 2]) {
      const props = t.call('getProperties', { dev }).props as Record<string, unknown>;
      expect(Object.keys(props).sort()).toEqual(
        [
          'name', 'pciPath', 'guid', 'ptrSupport', 'regIsGlobal', 'forceFlush', 'speed', 'port', 'latency', 'maxComms',
          'maxRecvs', 'netDeviceType', 'netDeviceVersion', 'vProps', 'maxP2pBytes', 'maxCollBytes', 'maxMultiRequestSize',
          'railId', 'planeId',
        ].sort(),
      );
      expect(props).toEqual({
        name: `tsnet-loop${dev}`,
        pciPath: null,
        guid: expect.any(BigInt),
        ptrSupport: 1,
        regIsGlobal: 0,
        forceFlush: 0,
        speed: 100000,
        port: 0,
        latency: 0,
        maxComms: 65536,
        maxRecvs: 8,
        netDeviceType: 0,
        netDeviceVersion: 0,
        vProps: { ndevs: 1, devs: [dev] },
        maxP2pBytes: 1 << 30,
        maxCollBytes: 1 << 30,
        maxMultiRequestSize: 1,
        railId: -1,
        planeId: -1,
      });
      guids.push(props.guid as bigint);
    }
    expect(new Set(guids).size).toBe(3);
    for (const g of guids) expect(g > 0n && g < 2n ** 64n).toBe(true);
    // The same in another instance (another process of this host).
    const other = setup({ ...LOOP, TSNET_LOOPBACK_DEVICES: '3' });
    other.init();
    expect([0, 1, 2].map((dev) => (other.call('getProperties', { dev }).props as { guid: bigint }).guid)).toEqual(guids);
  });

  it.each([1, -1, 1.5, '0', undefined, NaN])('a bad device (%j) is INVALID_ARGUMENT', (dev) => {
    const t = setup();
    const ctx = t.init();
    expect(t.call('getProperties', { dev })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('listen', { ctx, dev })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    const l = t.call('listen', { ctx, dev: 0 });
    expect(t.call('connect', { ctx, dev, handle: l.handle })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings()).toEqual(['getProperties', 'listen', 'connect'].map((op) => `${op}: device ${dev} does not exist (tsnet has 1: 0 to 0)`));
  });

  it('setNetAttr takes its hints and answers success', () => {
    const t = setup();
    const ctx = t.init();
    expect(t.call('setNetAttr', { ctx, sendCommAttr: { maxConcurrentPeers: 4 } })).toEqual({});
    expect(log.some((l) => l.level === LogLevel.TRACE && l.msg.startsWith('setNetAttr: '))).toBe(true);
  });
});

describe('Plugin handshake', () => {
  it('accept answers {comm: 0} until a peer connected; then each side gets its comm once', () => {
    const t = setup();
    const ctx = t.init();
    const l = t.call('listen', { ctx, dev: 0 });
    expect(l).toEqual({ listen: expect.any(Number), handle: expect.any(Uint8Array) });
    expect((l.handle as Uint8Array).length).toBeLessThanOrEqual(128);
    expect(t.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    const c = t.call('connect', { ctx, dev: 0, handle: l.handle });
    expect(c).toEqual({ comm: expect.any(Number) });
    const a = t.call('accept', { listen: l.listen });
    expect(a).toEqual({ comm: expect.any(Number) });
    expect(new Set([l.listen, c.comm, a.comm, ctx]).size).toBe(4);
    expect(t.call('accept', { listen: l.listen })).toEqual({ comm: 0 });
    expect(infos()).toEqual(expect.arrayContaining([`comm ${c.comm}: connected`, `comm ${a.comm}: accepted`]));
    expect(t.attach(c.comm as number)).toBeInstanceOf(Int32Array);
    expect(t.attach(a.comm as number)).toBeInstanceOf(Int32Array);
  });

  it('connect takes NCCL\'s 128-byte handle; several connections to one listener', () => {
    const t = setup();
    const ctx = t.init();
    const l = t.call('listen', { ctx, dev: 0 });
    const ids = new Set<number>();
    for (let i = 0; i < 3; i++) {
      const handle = new Uint8Array(128);
      handle.set(l.handle as Uint8Array);
      ids.add(t.call('connect', { ctx, dev: 0, handle }).comm as number);
      ids.add(t.call('accept', { listen: l.listen }).comm as number);
    }
    expect(ids.size).toBe(6);
    expect(ids.has(0)).toBe(false);
  });

  // libfabric's connect queues its CONNECT message for the I/O thread; published only by the
  // watchdog's next tick (every 50-1000 ms), each connect took that long (driver: teardown).
  it('a control call publishes what the transport queued during it, even when it fails', () => {
    const t = setup();
    const ctx = t.init();
    const tr = t.host.transports[0];
    const events: string[] = [];
    const connect = tr.connect.bind(tr);
    tr.connect = (dev, handle) => {
      events.push('queued');
      return connect(dev, handle);
    };
    const flush = tr.flush.bind(tr);
    tr.flush = () => {
      events.push('flush');
      flush();
    };
    const l = t.call('listen', { ctx, dev: 0 });
    events.length = 0;
    expect(t.call('connect', { ctx, dev: 0, handle: l.handle })).toEqual({ comm: expect.any(Number) });
    expect(events).toEqual(['queued', 'flush']);
    events.length = 0;
    expect(t.call('closeListen', { listen: 12345 }).result).toBe(ResultCode.INVALID_ARGUMENT);
    expect(events).toEqual(['flush']);
  });

  it('rejects bad handles, closed listeners and unknown comms with INVALID_ARGUMENT', () => {
    const t = setup();
    const ctx = t.init();
    expect(t.call('connect', { ctx, dev: 0, handle: new Uint8Array(128) })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings().at(-1)).toBe('connect: the handle is not a tsnet loopback handle');
    const l = t.call('listen', { ctx, dev: 0 });
    expect(t.call('closeListen', { listen: l.listen })).toEqual({});
    expect(t.call('connect', { ctx, dev: 0, handle: l.handle })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings().at(-1)).toBe('connect: no loopback listener matches the handle (closed?)');
    expect(t.call('accept', { listen: l.listen })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('closeListen', { listen: l.listen })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('close', { comm: 4242 })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('attach', { comm: 4242, status: new ArrayBuffer(SLOTS * SLOT.ints * 4) })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings().at(-1)).toBe('attach: no comm 4242');
  });
});

describe('Plugin registrations', () => {
  it('regMr wraps host memory at its address; deregMr releases it once', () => {
    const t = setup();
    const ctx = t.init();
    const { send } = t.connect(ctx);
    const a = t.call('regMr', { comm: send, type: 1, buffer: new ArrayBuffer(4096), base: 0x7000_0000 });
    expect(a).toEqual({ mr: expect.any(Number) });
    expect(t.call('deregMr', { mr: a.mr })).toEqual({});
    expect(t.call('deregMr', { mr: a.mr })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings()).toEqual([`deregMr: deregMr: no region ${a.mr}`]);
  });

  it.each([2, 3, 4, 0])('regMr of memory type %i is INVALID_ARGUMENT with a message', (type) => {
    const t = setup();
    const ctx = t.init();
    const { send } = t.connect(ctx);
    expect(t.call('regMr', { comm: send, type, buffer: new ArrayBuffer(16), base: 0x1000 })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    const w = warnings().join('\n');
    expect(w).toContain(`regMr: memory type 0x${type.toString(16)}`);
    expect(w).toContain('is not supported; tsnet registers host memory (0x1)');
    if (type === 2) expect(w).toContain('(CUDA)');
  });

  it('regMrDmaBuf where the transport offers no DMA-BUF is INVALID_ARGUMENT with a message', () => {
    const t = setup();
    const ctx = t.init();
    const { send } = t.connect(ctx);
    expect(t.call('regMr', { comm: send, type: 1, buffer: new ArrayBuffer(16), base: 0x1000, fd: 5, offset: 0 })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings().join('\n')).toContain('regMrDmaBuf: tsnet over loopback registers no memory through DMA-BUF here (ptrSupport 0x1: host)');
  });

  it('regMrDmaBuf hands the transport the fd and offset during the call only, for GPU memory only', () => {
    const t = setup();
    const ctx = t.init();
    const { send } = t.connect(ctx);
    // The loopback transport, as one that offers GPU memory and DMA-BUF.
    const lt = t.host.transports[0];
    Object.defineProperty(lt, 'traits', { value: { ...lt.traits, ptrSupport: 0x7 } });
    const seen: (DmaBuf | undefined)[] = [];
    Object.defineProperty(lt, 'register', { value: (r: Region) => seen.push(r.dmabuf && { ...r.dmabuf }) });
    const a = t.call('regMr', { comm: send, type: 2, base: 0x7000_0000_2000, size: 65536, fd: 9, offset: 8192 });
    expect(a).toEqual({ mr: expect.any(Number) });
    expect(seen).toEqual([{ fd: 9, offset: 8192 }]);
    expect((t.plugin as unknown as { regions: Regions }).regions.get(a.mr as number).dmabuf).toBeUndefined();
    // A plain regMr of GPU memory: no fd.
    t.call('regMr', { comm: send, type: 2, base: 0x7000_1000_0000, size: 4096 });
    expect(seen[1]).toBeUndefined();
    // Host memory through a DMA-BUF: refused.
    expect(t.call('regMr', { comm: send, type: 1, buffer: new ArrayBuffer(16), base: 0x1000, fd: 9, offset: 0 })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(warnings().at(-1)).toContain('regMrDmaBuf: memory type 0x1 (host): a DMA-BUF is registered as GPU memory (CUDA, 0x2)');
    expect(seen).toHaveLength(2);
  });

  it('regMr on an unknown comm is INVALID_ARGUMENT', () => {
    const t = setup();
    t.init();
    expect(t.call('regMr', { comm: 999, type: 1, buffer: new ArrayBuffer(16), base: 0x1000 })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
  });
});

describe('Plugin requests through the mailbox', () => {
  it('moves bytes between registered regions at offsets; slots go POSTED -> DONE with result and sizes', async () => {
    const t = setup({ ...LOOP, TSNET_NSOCKS: '4' });
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, 10 * MiB);
    const r = t.reg(recv, 10 * MiB);
    r.bytes.fill(0xee);
    const sizes = [0, 1, 64 * KiB, 64 * KiB + 1, 8 * MiB];
    for (const [k, size] of sizes.entries()) {
      fill(s.bytes.subarray(100, 100 + size), k);
      r.bytes.fill(0xee);
      t.post({ op: Op.RECV, comm: recv, slot: k, bufs: [[r.mr, 200, size + 10, 7]] });
      t.post({ op: Op.SEND, comm: send, slot: k, bufs: [[s.mr, 100, size, 7]] });
      // Completions come later (the link's events), written into the slots.
      expect(t.slot(send, k)).toEqual(POSTED);
      expect(t.slot(recv, k)).toEqual(POSTED);
      await t.settle();
      expect(t.slot(send, k)).toEqual(done(size));
      expect(t.slot(recv, k)).toEqual(done(size));
      expect(firstDiff(r.bytes.subarray(200, 200 + size), s.bytes.subarray(100, 100 + size))).toBe(-1);
      expect(allBytes(r.bytes.subarray(0, 200), 0xee)).toBe(true);
      expect(allBytes(r.bytes.subarray(200 + size), 0xee)).toBe(true);
    }
    expect(warnings()).toEqual([]);
  });

  it('buffers without a region (mr 0) of size 0 work', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    t.post({ op: Op.RECV, comm: recv, slot: 3, bufs: [[0, 0, 0, 1]] }, { op: Op.SEND, comm: send, slot: 4, bufs: [[0, 0, 0, 1]] });
    await t.settle();
    expect(t.slot(recv, 3)).toEqual(done(0));
    expect(t.slot(send, 4)).toEqual(done(0));
  });

  it('runs every record of one mailbox: a receive of 8 with tags out of order and its 8 sends', async () => {
    const t = setup({ ...LOOP, TSNET_NSOCKS: '2' });
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    const size = (tag: number) => 1000 * tag + 17 + (tag === 5 ? 100 * KiB : 0);
    const recvBufs: BufSpec[] = [];
    for (let i = 0; i < 8; i++) recvBufs.push([r.mr, i * 128 * KiB, 128 * KiB, 7 - i]); // buffer i has tag 7-i
    const order = [3, 6, 0, 5, 1, 7, 2, 4];
    const sends: Rec[] = order.map((tag, k) => {
      fill(s.bytes.subarray(tag * 128 * KiB, tag * 128 * KiB + size(tag)), 40 + tag);
      return { op: Op.SEND, comm: send, slot: 10 + k, bufs: [[s.mr, tag * 128 * KiB, size(tag), tag]] };
    });
    t.post({ op: Op.RECV, comm: recv, slot: 9, bufs: recvBufs }, ...sends);
    await t.settle();
    expect(t.slot(recv, 9, 8)).toEqual(done(...recvBufs.map((b) => size(b[3]))));
    order.forEach((tag, k) => expect(t.slot(send, 10 + k)).toEqual(done(size(tag))));
    for (let i = 0; i < 8; i++) {
      const tag = 7 - i;
      const got = r.bytes.subarray(i * 128 * KiB, i * 128 * KiB + size(tag));
      expect(firstDiff(got, s.bytes.subarray(tag * 128 * KiB, tag * 128 * KiB + size(tag))), `tag ${tag}`).toBe(-1);
    }
  });

  it('turn(count) runs only the first count records', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const m = t.host.mailbox;
    const rec = (k: number, op: number, comm: number, slot: number) => m.set([op, comm, slot, 1, 0, 0, 0, 0, 0, 0], k * STRIDE);
    rec(0, Op.RECV, recv, 0);
    rec(1, Op.SEND, send, 0);
    rec(2, Op.SEND, send, 1);
    for (const [comm, s] of [[recv, 0], [send, 0], [send, 1]]) Atomics.store(t.statuses.get(comm)!, s * SLOT.ints, SlotState.POSTED);
    t.plugin.turn(2);
    await t.settle();
    expect(t.slot(recv, 0)).toEqual(done(0));
    expect(t.slot(send, 0)).toEqual(done(0));
    expect(t.slot(send, 1)).toEqual(POSTED);
  });

  it('turns again on its own while submissions wait for room in a full ring, once per loop round', async () => {
    const t = setup();
    t.init();
    const transport = t.host.transports[0];
    let waiting = 3; // flushes that still find a full ring
    let flushes = 0;
    transport.flush = () => {
      flushes++;
      return --waiting > 0;
    };
    t.plugin.turn(0);
    t.plugin.turn(0); // a second turn in the same round schedules nothing more
    expect(flushes).toBe(2);
    await t.settle();
    expect(flushes).toBe(3);
    expect(waiting).toBe(0);
    await t.settle();
    expect(flushes).toBe(3); // no backlog: no turn of its own
  });

  it('a flush of host memory completes at once, writing no sizes', async () => {
    const t = setup();
    const ctx = t.init();
    const { recv } = t.connect(ctx);
    const r = t.reg(recv, 4096);
    const st = t.statuses.get(recv)!;
    st.fill(-1, 5 * SLOT.ints + SLOT.sizes, 6 * SLOT.ints);
    t.post({ op: Op.FLUSH, comm: recv, slot: 5, bufs: [[r.mr, 0, 4096, 0]] });
    expect(t.slot(recv, 5, 8)).toEqual({ state: SlotState.DONE, result: 0, sizes: new Array(8).fill(-1) });
  });

  it('a striped send larger than its receive fails both with INVALID_USAGE and writes nothing', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    r.bytes.fill(0xee);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 100, 1000, 0]] });
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 300 * KiB, 0]] });
    await t.settle();
    expect(t.slot(recv, 0)).toEqual(failed(ResultCode.INVALID_USAGE, 300 * KiB));
    expect(t.slot(send, 0)).toEqual(failed(ResultCode.INVALID_USAGE, 300 * KiB));
    expect(allBytes(r.bytes, 0xee)).toBe(true);
  });

  it('an eager send larger than its receive: the receive fails, the send was handed over, the next send on the comm fails', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 10, 0]] }, { op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 11, 0]] });
    await t.settle();
    expect(t.slot(recv, 0)).toEqual(failed(ResultCode.INVALID_USAGE, 11));
    expect(t.slot(send, 0)).toEqual(done(11));
    t.post({ op: Op.RECV, comm: recv, slot: 1, bufs: [[r.mr, 0, 10, 0]] }, { op: Op.SEND, comm: send, slot: 1, bufs: [[s.mr, 0, 10, 0]] });
    await t.settle();
    expect(t.slot(send, 1)).toEqual(failed(ResultCode.INVALID_USAGE, 10));
    expect(t.slot(recv, 1)).toEqual(done(10));
  });

  it('misdirected requests fail with INTERNAL_ERROR: a send on a receive comm, a receive on a send comm, an unknown region or op', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    t.post(
      { op: Op.SEND, comm: recv, slot: 1, bufs: [[0, 0, 0, 0]] },
      { op: Op.RECV, comm: send, slot: 2, bufs: [[0, 0, 0, 0]] },
      { op: Op.SEND, comm: send, slot: 3, bufs: [[98765, 0, 10, 0]] },
      { op: 77, comm: send, slot: 4, bufs: [[0, 0, 0, 0]] },
    );
    expect(t.slot(recv, 1)).toEqual(failed(ResultCode.INTERNAL_ERROR, 0));
    expect(t.slot(send, 2)).toEqual(failed(ResultCode.INTERNAL_ERROR, 0));
    expect(t.slot(send, 3)).toEqual(failed(ResultCode.INTERNAL_ERROR, 0));
    expect(t.slot(send, 4)).toEqual(failed(ResultCode.INTERNAL_ERROR, 0));
    const w = warnings();
    expect(w.length).toBe(4);
    expect(w[2]).toBe(`comm ${send}: no registered region 98765`);
    expect(w[3]).toBe(`comm ${send}: operation 77 does not fit comm ${send}`);
    // The comms still work.
    t.post({ op: Op.RECV, comm: recv, slot: 5, bufs: [[0, 0, 0, 0]] }, { op: Op.SEND, comm: send, slot: 5, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    expect(t.slot(recv, 5)).toEqual(done(0));
    expect(t.slot(send, 5)).toEqual(done(0));
  });

  it('a request on a closed or unknown comm completes nothing and warns', async () => {
    const t = setup();
    const ctx = t.init();
    const { send } = t.connect(ctx);
    expect(t.call('close', { comm: send })).toEqual({});
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 0]] }, { op: Op.SEND, comm: 5555, slot: 0, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    expect(t.slot(send, 0)).toEqual(POSTED); // the test marked it; nothing else wrote it
    expect(warnings()).toEqual([`a request was posted on comm ${send}, which is closed`, 'a request was posted on comm 5555, which is closed']);
  });

  it('a completion for a slot that is not POSTED is not written, with a WARN', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[0, 0, 0, 0]], unposted: true }, { op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    expect(t.slot(recv, 0)).toEqual({ state: SlotState.FREE, result: 0, sizes: [0] });
    expect(t.slot(send, 0)).toEqual(done(0));
    expect(warnings()).toEqual([`comm ${recv}: request slot 0 completed but is not in flight`]);
  });
});

describe('Plugin: a garbage collection once the thread\'s last comm closed', () => {
  it('one, IDLE_COLLECT_MS after the last close and never inside it; none while a comm is open, or one was opened meanwhile', async () => {
    const gc = vi.fn();
    const g = globalThis as { gc?: () => void };
    const had = g.gc;
    g.gc = gc;
    const later = () => new Promise((r) => setTimeout(r, IDLE_COLLECT_MS + 60));
    try {
      const t = setup();
      const ctx = t.init();
      const a = t.connect(ctx);
      const b = t.connect(ctx);
      t.call('close', { comm: a.send });
      t.call('close', { comm: a.recv });
      await later();
      expect(gc).not.toHaveBeenCalled(); // b's comms are open
      t.call('close', { comm: b.send });
      t.call('close', { comm: b.recv });
      expect(gc).not.toHaveBeenCalled(); // not inside the close
      const c = t.connect(ctx); // within the delay: the comms are in use again
      await later();
      expect(gc).not.toHaveBeenCalled();
      t.call('close', { comm: c.send });
      t.call('close', { comm: c.recv });
      await later();
      expect(gc).toHaveBeenCalledTimes(1);
      t.call('finalize', { ctx }); // no comm left to close: nothing more
      await later();
      expect(gc).toHaveBeenCalledTimes(1);
    } finally {
      g.gc = had;
    }
  });
});

describe('Plugin deregMr, close and finalize with requests in flight', () => {
  it('deregMr of a receive\'s region: success, an INFO line, the receive ends with INVALID_USAGE; the comm goes on', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const r = t.reg(recv, 4096);
    const r2 = t.reg(recv, 4096);
    const s = t.reg(send, 4096);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 4096, 0]] });
    await t.settle();
    expect(t.slot(recv, 0)).toEqual(POSTED);
    expect(t.call('deregMr', { mr: r.mr })).toEqual({});
    expect(infos()).toContain(`deregMr: comm ${recv}: 1 request(s) in flight on the region were cancelled`);
    expect(t.slot(recv, 0)).toEqual(failed(ResultCode.INVALID_USAGE, 0));
    expect(t.call('deregMr', { mr: r.mr })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    fill(s.bytes, 5);
    r.bytes.fill(0xee);
    t.post({ op: Op.RECV, comm: recv, slot: 1, bufs: [[r2.mr, 0, 4096, 0]] }, { op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 4096, 0]] });
    await t.settle();
    expect(t.slot(recv, 1)).toEqual(done(4096));
    expect(t.slot(send, 0)).toEqual(done(4096));
    expect(firstDiff(r2.bytes, s.bytes)).toBe(-1);
    expect(allBytes(r.bytes, 0xee)).toBe(true);
  });

  it('deregMr of a send\'s region: success, an INFO line, the send fails and the link closes (the receive comm fails with REMOTE_ERROR)', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[0, 0, 0, 9]] }); // another tag: never matched
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 200 * KiB, 0]] }); // striped: in flight
    await t.settle();
    expect(t.slot(send, 0)).toEqual(POSTED);
    expect(t.call('deregMr', { mr: s.mr })).toEqual({});
    expect(infos()).toContain(`deregMr: comm ${send}: 1 request(s) in flight on the region were cancelled`);
    expect(t.slot(send, 0)).toEqual(failed(ResultCode.INVALID_USAGE, 0));
    await t.settle();
    expect(t.slot(recv, 0)).toEqual(failed(ResultCode.REMOTE_ERROR, 0));
    t.post({ op: Op.SEND, comm: send, slot: 1, bufs: [[0, 0, 0, 0]] });
    expect(t.slot(send, 1)).toEqual(failed(ResultCode.INVALID_USAGE, 0));
  });

  it('deregMr after the requests completed: success, no INFO line', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const r = t.reg(recv, 4096);
    const s = t.reg(send, 4096);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 4096, 0]] }, { op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 4096, 0]] });
    await t.settle();
    expect([t.slot(recv, 0), t.slot(send, 0)]).toEqual([done(4096), done(4096)]);
    expect(t.call('deregMr', { mr: r.mr })).toEqual({});
    expect(t.call('deregMr', { mr: s.mr })).toEqual({});
    expect(infos().filter((m) => m.startsWith('deregMr'))).toEqual([]);
  });

  it('close of a send comm with sends in flight: an INFO line, the slots fail at close and are never written again; the peer fails', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const r = t.reg(recv, MiB);
    const s = t.reg(send, MiB);
    r.bytes.fill(0xee);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 10, 5]] }); // never matched
    for (let k = 0; k < 4; k++) t.post({ op: Op.SEND, comm: send, slot: k, bufs: [[s.mr, 0, 200 * KiB, 0]] });
    await t.settle();
    expect(t.call('close', { comm: send })).toEqual({});
    expect(infos()).toContain(`comm ${send}: closed with 4 send(s) in flight; cancelled`);
    for (let k = 0; k < 4; k++) expect(t.slot(send, k)).toEqual(failed(ResultCode.INVALID_USAGE, 0));
    // The core may reuse the memory once close returns: nothing writes it any more.
    const st = t.statuses.get(send)!;
    st.fill(12345);
    await t.settle();
    expect(st.every((x) => x === 12345)).toBe(true);
    expect(t.slot(recv, 0)).toEqual(failed(ResultCode.REMOTE_ERROR, 0));
    expect(allBytes(r.bytes, 0xee)).toBe(true);
    expect(t.call('close', { comm: recv })).toEqual({});
    expect(t.call('deregMr', { mr: s.mr })).toEqual({});
    expect(t.call('deregMr', { mr: r.mr })).toEqual({});
    expect(t.call('close', { comm: send })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
  });

  it('close of a receive comm fails the peer\'s pending sends with REMOTE_ERROR', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    for (let k = 0; k < 3; k++) t.post({ op: Op.SEND, comm: send, slot: k, bufs: [[s.mr, 0, 100 * KiB * (k + 1), 0]] });
    await t.settle();
    expect(t.call('close', { comm: recv })).toEqual({});
    await t.settle();
    for (let k = 0; k < 3; k++) expect(t.slot(send, k)).toEqual(failed(ResultCode.REMOTE_ERROR, 0));
    expect(warnings()).toEqual([`comm ${send}: the receiver closed the connection; failing 3 pending send(s)`]);
    expect(t.call('deregMr', { mr: s.mr })).toEqual({});
  });

  it('closeListen drops a connection not yet accepted: the connected side fails with REMOTE_ERROR', async () => {
    const t = setup();
    const ctx = t.init();
    const l = t.call('listen', { ctx, dev: 0 });
    const send = t.call('connect', { ctx, dev: 0, handle: l.handle }).comm as number;
    t.attach(send);
    expect(t.call('closeListen', { listen: l.listen })).toEqual({});
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    expect(t.slot(send, 0)).toEqual(failed(ResultCode.REMOTE_ERROR, 0));
  });

  it('finalize closes only its context\'s comms and listeners; requests in flight fail at finalize, nothing after', async () => {
    const t = setup();
    const a = t.init();
    const b = t.init(2n);
    const ca = t.connect(a);
    const cb = t.connect(b);
    const la = t.call('listen', { ctx: a, dev: 0 });
    const lb = t.call('listen', { ctx: b, dev: 0 });
    const r = t.reg(ca.recv, MiB);
    for (let k = 0; k < 4; k++) t.post({ op: Op.RECV, comm: ca.recv, slot: k, bufs: [[r.mr, 0, MiB, 0]] });
    t.post({ op: Op.SEND, comm: ca.send, slot: 0, bufs: [[0, 0, 0, 3]] }); // taken by nobody: tag 3
    await t.settle();
    expect(t.call('finalize', { ctx: a })).toEqual({});
    expect(infos()).toContain(`comm ${ca.recv}: closed with 4 receive(s) in flight; cancelled`);
    for (let k = 0; k < 4; k++) expect(t.slot(ca.recv, k)).toEqual(failed(ResultCode.INVALID_USAGE, 0));
    expect(t.slot(ca.send, 0)).toEqual(done(0));
    t.statuses.get(ca.recv)!.fill(12345);
    await t.settle();
    expect(t.statuses.get(ca.recv)!.every((x) => x === 12345)).toBe(true);
    expect(t.call('close', { comm: ca.send })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('close', { comm: ca.recv })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('accept', { listen: la.listen })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('accept', { listen: ca.listen })).toEqual({ result: ResultCode.INVALID_ARGUMENT });
    expect(t.call('deregMr', { mr: r.mr })).toEqual({});
    // Context b is untouched: its comms move data, its listener accepts.
    const s = t.reg(cb.send, 4096);
    const rb = t.reg(cb.recv, 4096);
    fill(s.bytes, 3);
    t.post({ op: Op.RECV, comm: cb.recv, slot: 0, bufs: [[rb.mr, 0, 4096, 0]] }, { op: Op.SEND, comm: cb.send, slot: 0, bufs: [[s.mr, 0, 4096, 0]] });
    await t.settle();
    expect([t.slot(cb.send, 0), t.slot(cb.recv, 0)]).toEqual([done(4096), done(4096)]);
    expect(firstDiff(rb.bytes, s.bytes)).toBe(-1);
    expect(t.call('accept', { listen: lb.listen })).toEqual({ comm: 0 });
    expect(t.call('connect', { ctx: b, dev: 0, handle: lb.handle }).comm).toBeGreaterThan(0);
    expect(t.call('accept', { listen: lb.listen }).comm).toBeGreaterThan(0);
    expect(t.call('finalize', { ctx: b })).toEqual({});
  });
});

describe('the watchdog', () => {
  // TSNET_TIMEOUT_SEC=1: a tick every 250 ms.
  const QUICK = { ...LOOP, TSNET_TIMEOUT_SEC: '1', TSNET_STATS: '1' };
  const waiting = { work: true, pending: false, readable: false, spinning: false, sinceTurnMs: 400 };

  it('wakes its thread when work waits with no wake-up on its way: a WARN (one per 10 s), a turn, a wake-up, a count at finalize', async () => {
    const t = setup(QUICK);
    const ctx = t.init();
    let polls = 0;
    const tr = t.host.transports[0];
    const poll = tr.poll.bind(tr);
    tr.poll = () => (polls++, poll());
    t.host.wake = waiting;
    await new Promise((r) => setTimeout(r, 700));
    const lost = warnings().filter((m) => /no wake-up on its way/.test(m));
    expect(lost).toEqual(['protocol thread 0: work waited 400 ms with no wake-up on its way (1 time(s) so far); the watchdog wakes the thread']);
    expect(polls).toBeGreaterThanOrEqual(2);
    expect(t.host.selfWakes).toBeGreaterThanOrEqual(2); // for posted requests: a full turn
    t.host.wake = undefined; // this plugin's watchdog ticks on after the test
    expect(t.call('finalize', { ctx })).toEqual({});
    expect(infos()).toContainEqual(expect.stringMatching(/^stats: protocol thread 0: the watchdog found work no wake-up had announced [2-9] time\(s\)$/));
  });

  it('a step of the wall clock is no silence: a quiet comm with a receive pending lives on, and still moves data', async () => {
    const t = setup(QUICK);
    const ctx = t.init();
    const c = t.connect(ctx);
    const r = t.reg(c.recv, 4096);
    const s = t.reg(c.send, 4096);
    fill(s.bytes, 5);
    t.post({ op: Op.RECV, comm: c.recv, slot: 0, bufs: [[r.mr, 0, 4096, 0]] }); // pending: nothing is sent yet
    await t.settle();
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      vi.setSystemTime(Date.now() + 3_600_000); // NTP steps the time of day an hour on
      await new Promise((res) => setTimeout(res, 400)); // at least one tick of 250 ms
      vi.setSystemTime(Date.now() - 7_200_000); // and two hours back
      await new Promise((res) => setTimeout(res, 400));
    } finally {
      vi.useRealTimers();
    }
    expect(warnings()).toEqual([]);
    expect(t.slot(c.recv, 0)).toEqual(POSTED);
    t.post({ op: Op.SEND, comm: c.send, slot: 0, bufs: [[s.mr, 0, 4096, 0]] });
    await t.settle();
    expect([t.slot(c.send, 0), t.slot(c.recv, 0)]).toEqual([done(4096), done(4096)]);
    expect(firstDiff(r.bytes, s.bytes)).toBe(-1);
    expect(t.call('finalize', { ctx })).toEqual({});
  });

  it('says nothing where a wake-up is on its way, the thread polls, nothing waits, or a turn ran within the tick', async () => {
    const t = setup(QUICK);
    const ctx = t.init();
    for (const w of [{ pending: true }, { readable: true }, { spinning: true }, { work: false }, { sinceTurnMs: 100 }]) {
      t.host.wake = { ...waiting, ...w };
      await new Promise((r) => setTimeout(r, 300));
    }
    t.host.wake = undefined;
    expect(warnings()).toEqual([]);
    expect(t.host.selfWakes).toBe(0);
    expect(t.call('finalize', { ctx })).toEqual({});
    expect(infos().filter((m) => /no wake-up had announced/.test(m))).toEqual([]);
  });
});

describe('TSNET_STATS', () => {
  const STATS = { ...LOOP, TSNET_STATS: '1' };

  it('logs each comm\'s messages and bytes at close, and the thread\'s requests and CPU at finalize', async () => {
    const t = setup(STATS);
    t.host.cpu = 1_000_000; // CPU and busy time counted from here (the first call)
    t.host.busyUs = 300_000;
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    for (let k = 0; k < 3; k++)
      t.post({ op: Op.RECV, comm: recv, slot: k, bufs: [[r.mr, 0, 500_000, 0]] }, { op: Op.SEND, comm: send, slot: k, bufs: [[s.mr, 0, 500_000, 0]] });
    await t.settle();
    expect(t.call('close', { comm: send })).toEqual({});
    expect(t.call('close', { comm: recv })).toEqual({});
    const lines = infos().filter((m) => m.startsWith('stats: '));
    expect(lines).toEqual([
      expect.stringMatching(new RegExp(`^stats: comm ${send} \\(send\\): 3 messages, 0\\.002 GB in \\d+\\.\\d\\d s$`)),
      expect.stringMatching(new RegExp(`^stats: comm ${recv} \\(receive\\): 3 messages, 0\\.002 GB in \\d+\\.\\d\\d s$`)),
    ]);
    t.host.cpu = 1_006_000;
    t.host.busyUs = 303_000;
    expect(t.call('finalize', { ctx })).toEqual({});
    expect(infos().filter((m) => m.startsWith('stats: ')).slice(2)).toEqual([
      expect.stringMatching(/^stats: protocol thread 0: 6 requests in \d+\.\d\d s; CPU 0\.006 s \(1000\.00 us per request\), busy 0\.003 s \(500\.00 us per request\)$/),
      'stats: wake-ups of protocol thread 0: 4, mean 2.0 us, median < 2 us, p99 < 4 us, max 3 us',
      // the test host's clock stands still; the loopback transport connects at the first call
      // and does not time its handshakes
      'stats: protocol thread 0: connects: 1 comm(s) up, first call to comm median < 2 us, p99 < 2 us, max 0 us; 1 call(s), 0.0 ms in them',
      'stats: protocol thread 0: accepts: 1 comm(s) up; 1 call(s), 0.0 ms in them',
      expect.stringMatching(/^stats: protocol thread 0: V8 collections \d+ full \([\d.]+ ms\), \d+ young \([\d.]+ ms\); heap [\d.]+ of [\d.]+ MiB, external [\d.]+ MiB$/),
      'stats: I/O threads CPU 1.500 s, 2.250 s',
      // 4 wake-ups: one each below 4, 8 and 16 us, one of 2.5 ms (below 4096 us)
      'stats: wake-ups of 2 I/O thread(s): 4, mean 632.5 us, median < 8 us, p99 < 4096 us, max 2500 us',
      'stats: process CPU by thread (user + system): tsnet 2.50 s (tsnet-plugin 1.00 s, tsnet-io 1.50 s); the rest of the process 4.00 s in 1 thread(s) (app 4.00 s); the whole process 9.00 s, threads that have ended included',
    ]);
  });

  it('another protocol thread reports itself, not the I/O threads; without requests it says "-"', () => {
    const t = setup(STATS, 2);
    t.call('listen', { ctx: 5, dev: 0 });
    expect(t.call('finalize', { ctx: 5 })).toEqual({});
    expect(infos().filter((m) => m.startsWith('stats: '))).toEqual([
      expect.stringMatching(/^stats: protocol thread 2: 0 requests in \d+\.\d\d s; CPU 0\.000 s \(- us per request\), busy 0\.000 s \(- us per request\)$/),
      'stats: wake-ups of protocol thread 2: none',
      expect.stringMatching(/^stats: protocol thread 2: V8 collections \d+ full \([\d.]+ ms\), \d+ young \([\d.]+ ms\); heap [\d.]+ of [\d.]+ MiB, external [\d.]+ MiB$/),
    ]);
  });

  it('TSNET_STATS=steps turns timestamps on and adds a line per kind of request at finalize', async () => {
    const t = setup({ ...LOOP, TSNET_STATS: 'steps' });
    const ctx = t.init();
    expect(t.host.timestamped).toBe(1);
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    // the host's clock stands at 5 s: every turn flushes and every request ends then
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 4096, 0]], postedUs: 4_999_000, takenUs: 4_999_500 });
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 4096, 0]], postedUs: 4_999_990, takenUs: 4_999_995 });
    await t.settle();
    expect(t.call('finalize', { ctx })).toEqual({});
    const steps = infos().filter((m) => m.startsWith('stats: steps'));
    expect(steps).toEqual([
      'stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 5.00 / 5.00; picked up→in JS 5.00 / 5.00; in JS→handled 0.00 / 0.00; handled→polled 0.00 / 0.00; polled→submitted 0.00 / 0.00; submitted→done 0.00 / 0.00; posted→done 10.0 / 10.0',
      'stats: steps of irecv on protocol thread 0, 1 requests, median / p99 us: posted→picked up 500 / 500; picked up→in JS 500 / 500; in JS→handled 0.00 / 0.00; handled→polled 0.00 / 0.00; polled→submitted 0.00 / 0.00; submitted→done 0.00 / 0.00; posted→done 1000 / 1000',
    ]);
  });

  it('TSNET_STATS=steps counts requests the mailbox marks as the warm-up\'s apart', async () => {
    const t = setup({ ...LOOP, TSNET_STATS: 'steps' });
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 4096, 0]], postedUs: 4_999_000, takenUs: 4_999_500, warmup: true });
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[s.mr, 0, 4096, 0]], postedUs: 4_999_990, takenUs: 4_999_995, warmup: true });
    await t.settle();
    t.post({ op: Op.SEND, comm: send, slot: 1, bufs: [[s.mr, 0, 8, 0]], postedUs: 4_999_998, takenUs: 4_999_999 });
    t.post({ op: Op.RECV, comm: recv, slot: 1, bufs: [[r.mr, 0, 8, 0]], postedUs: 4_999_999, takenUs: 4_999_999 });
    await t.settle();
    expect(t.call('finalize', { ctx })).toEqual({});
    const steps = infos().filter((m) => m.startsWith('stats: steps'));
    expect(steps.map((l) => l.replace(/, median.*/, ''))).toEqual([
      'stats: steps of isend on protocol thread 0, 1 requests',
      'stats: steps of irecv on protocol thread 0, 1 requests',
      'stats: steps of isend of the warm-up on protocol thread 0, 1 requests',
      'stats: steps of irecv of the warm-up on protocol thread 0, 1 requests',
    ]);
    expect(steps[2]).toMatch(/posted→picked up 5\.00 \/ 5\.00; .*posted→done 10\.0 \/ 10\.0$/);
  });

  it('says nothing without TSNET_STATS', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[0, 0, 0, 0]] }, { op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    t.call('close', { comm: send });
    t.call('finalize', { ctx });
    expect(infos().filter((m) => m.startsWith('stats'))).toEqual([]);
  });
});

describe('TSNET_SPIN_MAX_US', () => {
  const late = (n: number): WakeDelays => ({ count: n, sumUs: n * 700, maxUs: 900, buckets: [0, 0, 0, 0, 0, 0, 0, 0, 0, n] }); // below 1024 us
  const fast = (n: number): WakeDelays => ({ count: n, sumUs: n * 5, maxUs: 7, buckets: [0, 0, n] }); // below 8 us

  it('grows the windows of this protocol thread and of the I/O threads when their wake-ups are late, and says so at TRACE (an INFO line came in the middle of the job\'s output)', () => {
    const t = setup({ ...LOOP, TSNET_SPIN_US: '200', TSNET_SPIN_MAX_US: '3000' });
    t.init();
    expect(t.host.spins).toEqual([200]);
    t.host.ownWakes = late(10);
    t.host.ioWakesNow = [late(5), fast(3)]; // 8 new: p90 below 1024 us
    t.plugin.adaptSpin();
    expect(t.host.spins).toEqual([200, 3000]); // 4 x 1024, capped
    expect(t.host.ioSpins).toEqual([3000]);
    const traces = () => log.filter((l) => l.level === LogLevel.TRACE).map((l) => l.msg);
    expect(traces()).toEqual(
      expect.arrayContaining([
        'busy-poll window of protocol thread 0: 3000 us (10 wake-up(s), p90 < 1024 us)',
        'busy-poll window of the I/O threads: 3000 us (8 wake-up(s), p90 < 1024 us)',
      ]),
    );
    expect(infos().filter((m) => m.startsWith('busy-poll window'))).toEqual([]);
    // fast wake-ups from now on: halved per tick down to the base, once per change
    for (let k = 1; k <= 6; k++) {
      t.host.ownWakes = { ...late(10), count: 10 + 10 * k, buckets: [0, 0, 10 * k, 0, 0, 0, 0, 0, 0, 10] };
      t.plugin.adaptSpin();
    }
    expect(t.host.spins).toEqual([200, 3000, 1500, 750, 375, 200]);
    expect(t.host.ioSpins).toEqual([3000]); // no new I/O wake-ups: unchanged
  });

  it('does nothing when set to 0, and other protocol threads leave the I/O threads alone', () => {
    const off = setup({ ...LOOP, TSNET_SPIN_US: '200', TSNET_SPIN_MAX_US: '0' });
    off.init();
    off.host.ownWakes = late(100);
    off.host.ioWakesNow = [late(100)];
    off.plugin.adaptSpin();
    expect(off.host.spins).toEqual([200]);
    expect(off.host.ioSpins).toEqual([]);
    // Unset, it follows late wake-ups up to 5000 us wherever the window is on.
    const dflt = setup({ ...LOOP, TSNET_SPIN_US: '200' });
    dflt.init();
    dflt.host.ownWakes = late(100);
    dflt.host.ioWakesNow = [late(100)];
    dflt.plugin.adaptSpin();
    expect(dflt.host.spins).toEqual([200, 4096]);
    expect(dflt.host.ioSpins).toEqual([4096]);
    const other = setup({ ...LOOP, TSNET_SPIN_US: '200', TSNET_SPIN_MAX_US: '3000' }, 2);
    other.call('listen', { ctx: 5, dev: 0 });
    other.host.ownWakes = late(10);
    other.host.ioWakesNow = [late(100)];
    other.plugin.adaptSpin();
    expect(other.host.spins).toEqual([200, 3000]);
    expect(other.host.ioSpins).toEqual([]);
  });
});

describe('TSNET_TRACE', () => {
  const TRACE = { ...LOOP, TSNET_TRACE: '/tmp/tsnet-trace-%p.json' };

  it('opens the file (%p: the pid) and writes a JSON array: thread names, a begin/end pair per request with its comm and size', async () => {
    const t = setup(TRACE);
    const ctx = t.init();
    expect(t.host.traceFiles).toEqual([`/tmp/tsnet-trace-${process.pid}.json`]);
    const { send, recv } = t.connect(ctx);
    const s = t.reg(send, MiB);
    const r = t.reg(recv, MiB);
    const sizes = [0, 4096, 300 * KiB];
    sizes.forEach((size, k) => {
      t.post({ op: Op.RECV, comm: recv, slot: k, bufs: [[r.mr, 0, size + 8, 0]], postedUs: 1000 + k, takenUs: 1100 + k });
      t.post({ op: Op.SEND, comm: send, slot: k, bufs: [[s.mr, 0, size, 0]], postedUs: 2000 + k, takenUs: 2100 + k });
    });
    t.post({ op: Op.FLUSH, comm: recv, slot: 9, bufs: [[r.mr, 0, 8, 0]], postedUs: 3000, takenUs: 3001 });
    await t.settle();
    t.host.clock = 9_000_000;
    t.plugin.turn(0); // the turn that follows the completions writes them out
    expect(t.call('finalize', { ctx })).toEqual({});
    // One write per turn, none empty.
    expect(t.host.traceWrites.every((w) => w.length > 0)).toBe(true);
    const events = t.host.traceJson();
    const pid = process.pid;
    for (const e of events) expect(e.pid).toBe(pid);
    expect(events.filter((e) => e.ph === 'M')).toEqual([
      { ph: 'M', name: 'thread_name', pid, tid: 1000, args: { name: 'tsnet-plugin (protocol thread 0)' } },
      { ph: 'M', name: 'thread_name', pid, tid: 1, args: { name: 'NCCL (posting threads)' } },
    ]);
    const begins = events.filter((e) => e.ph === 'b');
    const ends = events.filter((e) => e.ph === 'e');
    expect(begins.length).toBe(7);
    expect(new Set(begins.map((e) => e.id)).size).toBe(7);
    // Each request: begun when NCCL posted it, picked up by protocol thread 0, ended once.
    const want = [
      ...sizes.flatMap((size, k) => [
        { comm: recv, slot: k, name: `irecv ${size + 8} B`, bytes: size + 8, posted: 1000 + k, taken: 1100 + k },
        { comm: send, slot: k, name: `isend ${size} B`, bytes: size, posted: 2000 + k, taken: 2100 + k },
      ]),
      { comm: recv, slot: 9, name: 'iflush', bytes: 8, posted: 3000, taken: 3001 },
    ];
    for (const w of want) {
      const b = begins.find((e) => e.args?.comm === w.comm && e.args?.slot === w.slot);
      expect(b, `${w.name} on comm ${w.comm}`).toEqual({ ph: 'b', cat: `comm ${w.comm}`, name: w.name, id: expect.any(Number), pid, tid: 1, ts: w.posted, args: { comm: w.comm, slot: w.slot, bytes: w.bytes } });
      expect(events.filter((e) => e.ph === 'n' && e.id === b!.id)).toEqual([{ ph: 'n', cat: `comm ${w.comm}`, name: 'picked up', id: b!.id, pid, tid: 1000, ts: w.taken }]);
      const e = ends.filter((x) => x.id === b!.id);
      expect(e).toEqual([{ ph: 'e', cat: `comm ${w.comm}`, id: b!.id, pid, tid: 1000, ts: expect.any(Number), args: { result: 0 } }]);
    }
    expect(ends.length).toBe(7);
  });

  it('requests that end in a control call (deregMr, close, finalize) have their end in the file once the call returns', async () => {
    const t = setup(TRACE);
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    const r = t.reg(recv, MiB);
    const r2 = t.reg(recv, MiB);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[r.mr, 0, 10, 1]] }, { op: Op.RECV, comm: recv, slot: 1, bufs: [[r2.mr, 0, 10, 1]] });
    t.post({ op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 7]] });
    await t.settle();
    t.plugin.turn(0);
    expect(t.call('deregMr', { mr: r.mr })).toEqual({});
    expect(t.call('finalize', { ctx })).toEqual({});
    const events = t.host.traceJson();
    const begins = events.filter((e) => e.ph === 'b');
    const ends = events.filter((e) => e.ph === 'e');
    expect(begins.length).toBe(3);
    expect(ends.map((e) => [e.cat, e.args?.result]).sort()).toEqual(
      [[`comm ${send}`, 0], [`comm ${recv}`, ResultCode.INVALID_USAGE], [`comm ${recv}`, ResultCode.INVALID_USAGE]].sort(),
    );
    for (const b of begins) expect(ends.filter((e) => e.id === b.id).length).toBe(1);
  });

  it('a trace file that cannot be opened: a WARN, no trace, requests still work', async () => {
    const t = setup(TRACE);
    t.host.traceOk = false;
    const ctx = t.init();
    expect(warnings()).toEqual([`TSNET_TRACE=/tmp/tsnet-trace-${process.pid}.json: the file cannot be written; no trace`]);
    const { send, recv } = t.connect(ctx);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[0, 0, 0, 0]] }, { op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    t.plugin.turn(0);
    expect(t.slot(send, 0)).toEqual(done(0));
    expect(t.host.traceWrites).toEqual([]);
  });

  it('without TSNET_TRACE nothing is opened or written', async () => {
    const t = setup();
    const ctx = t.init();
    const { send, recv } = t.connect(ctx);
    t.post({ op: Op.RECV, comm: recv, slot: 0, bufs: [[0, 0, 0, 0]] }, { op: Op.SEND, comm: send, slot: 0, bufs: [[0, 0, 0, 0]] });
    await t.settle();
    t.plugin.turn(0);
    expect(t.host.traceFiles).toEqual([]);
    expect(t.host.traceWrites).toEqual([]);
  });
});
