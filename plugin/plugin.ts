// The plugin behind the core API: contexts, devices, listen/connect/accept, registrations,
// posted operations and close. Control calls answer synchronously (connect/accept answer
// "not yet" with comm 0); posted operations complete through the binding.
import { PtrKind, ResultCode } from './abi';
import { type Config, readConfig } from './config';
import { NetError, internalError, invalidArgument, resultOf } from './errors';
import { log } from './log';
import { type Region, Regions } from './memory';
import { Op } from './native';
import { propertiesOf } from './properties';
import { Receiver, type RecvBuf } from './protocol/receiver';
import type { Complete } from './protocol/endpoint';
import { Sender } from './protocol/sender';
import { LoopbackTransport } from './transports/loopback';
import { type IoBinding, NativeIo, adoptSocket } from './transports/native-lane';
import { TcpTransport, nodeLanes } from './transports/tcp';
import type { Connector, Listener, Transport } from './transports/transport';

export type CompleteFn = (comm: number, slot: number, result: number, sizes: number[]) => void;
export type TransportFactory = (config: Config) => Transport;

type Args = Record<string, unknown>;
type Answer = Record<string, unknown>;

interface Comm {
  id: number;
  ctx: number;
  engine: Sender | Receiver;
  /** Regions each in-flight request uses, by slot. */
  inflight: Map<number, Region[]>;
}

interface Ctx {
  id: number;
}

const PTR_NAMES: Record<number, string> = { [PtrKind.HOST]: 'host', [PtrKind.CUDA]: 'CUDA', [PtrKind.DMABUF]: 'dma-buf' };

export class Plugin {
  private nextId = 1;
  private config: Config | undefined;
  private transport: Transport | undefined;
  private readonly ctxs = new Map<number, Ctx>();
  private readonly listeners = new Map<number, { ctx: number; listener: Listener }>();
  private readonly connecting = new Map<string, Connector>();
  private readonly comms = new Map<number, Comm>();
  private readonly regions = new Regions();

  constructor(
    private readonly complete: CompleteFn,
    private readonly makeTransport: TransportFactory = defaultTransport,
    private readonly env: Record<string, string | undefined> = process.env,
    /** Told the configuration once it is read (the host sets its busy-poll window). */
    private readonly onConfig?: (config: Config) => void,
  ) {}

  /** Runs a control call; every failure becomes { result } with a WARN naming it. */
  control(op: string, args: Args): Answer {
    try {
      const fn = Object.hasOwn(this.ops, op) ? this.ops[op] : undefined;
      if (!fn) throw internalError(`unknown control call ${op}`);
      return fn(args);
    } catch (e) {
      const { code, message } = resultOf(e);
      log.warn(`${op}: ${message}`);
      return { result: code };
    }
  }

  /** Runs the posted requests of a mailbox. */
  data(mailbox: Float64Array, count: number, stride: number, head: number): void {
    for (let k = 0; k < count; k++) {
      const at = k * stride;
      const op = mailbox[at];
      const commId = mailbox[at + 1];
      const slot = mailbox[at + 2];
      const n = mailbox[at + 3];
      const comm = this.comms.get(commId);
      if (!comm) {
        log.warn(`a request was posted on comm ${commId}, which is closed`);
        continue;
      }
      try {
        const bufs: RecvBuf[] = [];
        const used: Region[] = [];
        for (let i = 0; i < n; i++) {
          const b = at + head + 4 * i;
          const mr = mailbox[b];
          const size = mailbox[b + 2];
          bufs.push({ view: this.regions.view(mr, mailbox[b + 1], size), size, tag: mailbox[b + 3] });
          if (mr) used.push(this.regions.get(mr));
        }
        if (op === Op.FLUSH) {
          // Host memory needs no flush: the bytes are in place once the receive completed.
          this.complete(comm.id, slot, ResultCode.SUCCESS, []);
          continue;
        }
        for (const r of used) r.inflight++;
        comm.inflight.set(slot, used);
        if (op === Op.SEND && comm.engine instanceof Sender) comm.engine.isend(slot, bufs[0].view, bufs[0].tag);
        else if (op === Op.RECV && comm.engine instanceof Receiver) comm.engine.irecv(slot, bufs);
        else throw internalError(`operation ${op} does not fit comm ${commId}`);
      } catch (e) {
        const { code, message } = resultOf(e);
        log.warn(`comm ${commId}: ${message}`);
        this.settle(comm, slot, code, [0]);
      }
    }
  }

  // Heartbeats and dead-peer detection for every comm (protocol/liveness.ts).
  private startWatchdog(timeoutMs: number): void {
    const every = Math.max(50, Math.min(1000, timeoutMs / 4));
    setInterval(() => {
      const now = Date.now();
      for (const c of this.comms.values()) c.engine.tick(now, timeoutMs);
    }, every).unref();
  }

  private settle(comm: Comm, slot: number, code: ResultCode, sizes: number[]): void {
    for (const r of comm.inflight.get(slot) ?? []) r.inflight--;
    comm.inflight.delete(slot);
    this.complete(comm.id, slot, code, sizes);
  }

  private id(): number {
    const id = this.nextId++;
    if (this.nextId > 0xffff_ffff) this.nextId = 1;
    return id;
  }

  private need<T>(map: Map<number, T>, id: unknown, what: string): T {
    const v = map.get(id as number);
    if (!v) throw invalidArgument(`no ${what} ${id}`);
    return v;
  }

  private device(dev: unknown): number {
    const t = this.transport!;
    if (typeof dev !== 'number' || !Number.isInteger(dev) || dev < 0 || dev >= t.devices.length)
      throw invalidArgument(`device ${dev} does not exist (tsnet has ${t.devices.length}: 0 to ${t.devices.length - 1})`);
    return dev;
  }

  private started(): Transport {
    if (!this.transport) throw internalError('init was not called');
    return this.transport;
  }

  private newComm(ctx: number, make: (name: string, done: Complete) => Sender | Receiver): number {
    const id = this.id();
    // Completions of a closed comm go nowhere: NCCL no longer holds its requests.
    const done: Complete = (slot, code, sizes) => {
      const c = this.comms.get(id);
      if (c) this.settle(c, slot, code, sizes);
    };
    const engine = make(`comm ${id}`, done);
    this.comms.set(id, { id, ctx, engine, inflight: new Map() });
    return id;
  }

  private readonly ops: Record<string, (a: Args) => Answer> = {
    init: (a) => {
      if (!this.config) {
        const { config, lines } = readConfig(this.env);
        this.transport = this.makeTransport(config);
        this.config = config;
        this.onConfig?.(config);
        this.startWatchdog(config.timeoutSec * 1000);
        for (const l of lines) log.info(`config: ${l}`);
        log.info(`transport ${this.transport.name}, ${this.transport.devices.length} device(s)`);
      }
      const id = this.id();
      this.ctxs.set(id, { id });
      log.info(
        a.legacy ? `context ${id}: the process-wide context of ncclNet v6-v10` : `context ${id} for communicator 0x${(a.commId as bigint).toString(16)}`,
      );
      return { ctx: id };
    },

    devices: () => ({ ndev: this.started().devices.length }),

    getProperties: (a) => {
      const t = this.started();
      const dev = this.device(a.dev);
      return { props: propertiesOf(dev, t.devices[dev], t.traits) };
    },

    listen: (a) => {
      const t = this.started();
      this.need(this.ctxs, a.ctx, 'context');
      const listener = t.listen(this.device(a.dev));
      const id = this.id();
      this.listeners.set(id, { ctx: a.ctx as number, listener });
      return { listen: id, handle: listener.handle };
    },

    connect: (a) => {
      const t = this.started();
      this.need(this.ctxs, a.ctx, 'context');
      const dev = this.device(a.dev);
      const handle = a.handle as Uint8Array;
      // NCCL retries with the same handle until the comm is up: the handle names the attempt.
      const key = `${a.ctx}/${dev}/${Buffer.from(handle).toString('hex')}`;
      let c = this.connecting.get(key);
      if (!c) this.connecting.set(key, (c = t.connect(dev, handle)));
      let link;
      try {
        link = c.poll();
      } catch (e) {
        this.connecting.delete(key);
        c.close();
        throw e;
      }
      if (!link) return { comm: 0 };
      this.connecting.delete(key);
      const comm = this.newComm(a.ctx as number, (name, done) => new Sender(link, link.policy ?? t.policy, done, name));
      log.info(`comm ${comm}: connected ${link.description}`);
      return { comm };
    },

    accept: (a) => {
      const t = this.started();
      const l = this.need(this.listeners, a.listen, 'listen comm');
      const link = l.listener.accept();
      if (!link) return { comm: 0 };
      const comm = this.newComm(l.ctx, (name, done) => new Receiver(link, link.policy ?? t.policy, done, name));
      log.info(`comm ${comm}: accepted ${link.description}`);
      return { comm };
    },

    regMr: (a) => {
      const t = this.started();
      const comm = this.need(this.comms, a.comm, 'comm');
      const type = a.type as number;
      if (!(type & t.traits.ptrSupport) || type & ~t.traits.ptrSupport)
        throw invalidArgument(
          `regMr: memory type 0x${type.toString(16)} (${PTR_NAMES[type] ?? 'unknown'}) is not supported; ` +
            `tsnet registers ${PTR_NAMES[t.traits.ptrSupport]} memory (0x${t.traits.ptrSupport.toString(16)})`,
        );
      const id = this.id();
      this.regions.add(id, comm.id, a.buffer as ArrayBuffer);
      return { mr: id };
    },

    deregMr: (a) => {
      const r = this.regions.delete(a.mr as number);
      if (!r) throw invalidArgument(`deregMr: no region ${a.mr}`);
      if (r.inflight > 0) {
        // Nothing may touch the memory once NCCL has it back: stop the comm using it.
        const comm = this.comms.get(r.comm);
        const err = new NetError(ResultCode.INTERNAL_ERROR, `deregMr of a region with ${r.inflight} operation(s) in flight`);
        comm?.engine.fail(err);
        throw err;
      }
      return {};
    },

    close: (a) => {
      const comm = this.need(this.comms, a.comm, 'comm');
      comm.engine.close();
      this.comms.delete(comm.id);
      for (const used of comm.inflight.values()) for (const r of used) r.inflight--;
      return {};
    },

    closeListen: (a) => {
      const l = this.need(this.listeners, a.listen, 'listen comm');
      l.listener.close();
      this.listeners.delete(a.listen as number);
      return {};
    },

    finalize: (a) => {
      const ctx = this.need(this.ctxs, a.ctx, 'context');
      // Only this context's leftovers go; other communicators keep theirs.
      for (const c of [...this.comms.values()].filter((c) => c.ctx === ctx.id)) this.ops.close({ comm: c.id });
      for (const [id, l] of [...this.listeners].filter(([, l]) => l.ctx === ctx.id)) this.ops.closeListen({ listen: id });
      this.ctxs.delete(ctx.id);
      return {};
    },

    setNetAttr: (a) => {
      this.need(this.ctxs, a.ctx, 'context');
      log.trace(() => `setNetAttr: ${JSON.stringify(a)}`);
      return {};
    },
  };
}

/** The configured transport; TCP moves its bytes on native I/O threads when io is given. */
export function makeTransport(config: Config, io?: IoBinding): Transport {
  if (config.transport === 'loopback') return new LoopbackTransport(config);
  if (config.io === 'native' && io) {
    // Bulk bytes (the data lanes) move on native I/O threads; the control lane (headers, small
    // messages, ACKs) stays on the plugin thread, one hop shorter for small messages.
    const engine = NativeIo.get({ threads: config.ioThreads, binding: io, spinUs: config.spinUs });
    return new TcpTransport(config, (sock, onFail, i) => (i === 0 ? nodeLanes(sock, onFail, i) : adoptSocket(sock, engine)));
  }
  return new TcpTransport(config);
}

const defaultTransport: TransportFactory = (config) => makeTransport(config);
