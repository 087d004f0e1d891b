// The plugin behind the core API, one instance per protocol thread: contexts, devices,
// listen/connect/accept, registrations, posted requests and close. Control calls answer
// synchronously (connect/accept answer "not yet" with comm 0). Posted requests arrive in
// batches (turn) and end by writing their slot's state in memory the native test() reads.
import { PtrKind, ResultCode } from './abi';
import { type Config, readConfig } from './config';
import { POST, SLOT, SlotState } from './engine/records';
import { internalError, invalidArgument, resultOf } from './errors';
import { log } from './log';
import { type Region, Regions } from './memory';
import { Op } from './native';
import { propertiesOf } from './properties';
import { ZEROS } from './protocol/endpoint';
import { newRecvArgs } from './protocol/receiver';
import { type ControlCallStats, type HoldSample, type ThreadCpu, type ThreadStats, type WakeDelays, GcStats, commStatsLine, controlCallsLine, gcStatsLine, holdLine, newSetupStats, processCpuLine, setupStatsLines, threadStatsLine, wakeStatsLine } from './stats';
import { SpinAdapter } from './spin';
import { StepStats, bothTraces } from './steps';
import { Tracer } from './trace';
import type { CommBase, Connector, Listener, RecvComm, SendComm, Transport } from './transports/transport';
import { monoMs } from './clock';

/** What the plugin needs from its thread's host (the binding, or fakes in tests). */
export interface PluginHost {
  /** This protocol thread's index (0 runs init, devices and properties). */
  readonly thread: number;
  /** The posted-request mailbox and its record stride. */
  readonly mailbox: Float64Array;
  readonly recordStride: number;
  readonly slotsPerComm: number;
  /** Starts protocol threads 1..n-1 (thread 0, at the first init). */
  startThreads(n: number): void;
  /** The busy-poll window of this thread. */
  setSpin(us: number): void;
  makeTransport(config: Config, regions: Regions): Transport;
  /** CPU microseconds this thread has used. */
  threadCpu(): number;
  /**
   * Submissions this thread wrote or posted itself instead of handing them to an I/O thread
   * (Port.writtenHere), and of those the frames that went only in part; undefined before the
   * engine started.
   */
  sentHere?(): { here: number; part: number } | undefined;
  /** Microseconds this thread spent working (turns and control calls), polling and sleep excluded. */
  busy(): number;
  /** The longest turn or control call since the last call (what: "turn" or the call's name, null if none), then starts over; absent in tests' hosts. */
  longest?(): { us: number; what: string | null };
  /** Microseconds this thread has waited for a CPU while runnable, -1 where unknown; absent in tests' hosts. */
  runWait?(): number;
  /** Early wake-ups of this thread so far (TSNET_EARLY_WAKE); absent in tests' hosts. */
  earlyWakes?(): number;
  /** This thread's control calls by name, as NCCL's threads waited for them (TSNET_STATS); absent in tests' hosts. */
  controlCalls?(): ControlCallStats[];
  /** CPU microseconds of each I/O thread (thread 0 reports them). */
  ioCpu(): number[];
  /** Every thread of the process and its CPU, and the whole process's (thread 0 reports them, TSNET_STATS). */
  processCpu?(): { threads: ThreadCpu[]; processUs?: number };
  /** How late each I/O thread woke when asked to (thread 0 reports them). */
  ioWakes(): WakeDelays[];
  /** How late this protocol thread took the wake-ups sent to it. */
  wakes(): WakeDelays;
  /**
   * Whether requests or completions wait for this thread, whether a wake-up is on its way
   * (asked, or readable in its eventfd), whether it busy-polls, and ms since its last turn.
   */
  wakeState?(): { work: boolean; pending: boolean; readable: boolean; spinning: boolean; sinceTurnMs: number };
  /** Sends this thread the wake-up another thread would: a full turn (posted requests too) soon after. */
  wakeSelf?(): void;
  /** Every I/O thread's busy-poll window (TSNET_SPIN_MAX_US; thread 0 sets it). */
  ioSetSpin(us: number): void;
  /** TSNET_TRACE: the process's trace file. */
  traceOpen(path: string): boolean;
  traceWrite(text: string): void;
  /** Microseconds, the clock of trace timestamps. */
  now(): number;
  /** TSNET_STATS=steps: requests and completions carry their times, with no trace file. */
  timestamps(): void;
}

type Args = Record<string, unknown>;
type Answer = Record<string, unknown>;

interface Comm {
  id: number;
  ctx: number;
  /** The NCCL device it was made on. */
  dev: number;
  endpoint: CommBase;
  send: SendComm | undefined;
  recv: RecvComm | undefined;
  /** The slot states test() reads (set at attach). */
  status: Int32Array | undefined;
  opened: number;
}

/** Protocol threads at most (embed/host.h kMaxProtocolThreads): each thread's ids step by it. */
const ID_STEP = 16;

const PTR_NAMES: Record<number, string> = { [PtrKind.HOST]: 'host', [PtrKind.CUDA]: 'CUDA', [PtrKind.DMABUF]: 'dma-buf' };
/** "host, CUDA" for a ptrSupport value. */
function ptrNames(bits: number): string {
  const names = [PtrKind.HOST, PtrKind.CUDA, PtrKind.DMABUF].filter((b) => bits & b).map((b) => PTR_NAMES[b]);
  return names.length ? names.join(', ') : 'no';
}

/** How long after its last comm closed a protocol thread collects garbage (idleCollect). */
export const IDLE_COLLECT_MS = 100;

export class Plugin {
  // Ids are unique in the process: thread k hands out k+1, k+1+16, ... (log lines name comms).
  private nextId: number;
  private config: Config | undefined;
  private transport: Transport | undefined;
  private tracer: Tracer | undefined;
  /** TSNET_STATS=steps. */
  private steps: StepStats | undefined;
  /** TSNET_SPIN_MAX_US: this thread's window, and (thread 0) the I/O threads'. */
  private spinSelf: SpinAdapter | undefined;
  private spinIo: SpinAdapter | undefined;
  /** A turn is scheduled because submissions wait for room in a full ring. */
  private again = false;
  /** Times the watchdog found work no wake-up had announced (TSNET_STATS). */
  private lostWakes = 0;
  /** The watchdog's timer: one per thread for the process's life; tests that make many Plugins in one thread stop it (stopWatchdog). */
  private watchdog: ReturnType<typeof setInterval> | undefined;
  private readonly ctxs = new Set<number>();
  private warmupAsked = false; // the first init's answer carries TSNET_WARMUP, later ones 0
  private readonly listeners = new Map<number, { ctx: number; dev: number; listener: Listener }>();
  /** Connects NCCL retries, by handle: the attempt, and when its first call came (host.now(), µs; TSNET_STATS). */
  private readonly connecting = new Map<string, { c: Connector; since: number }>();
  private readonly comms = new Map<number, Comm>();
  /** A collection asked for once this thread's last comm closed (idleCollect). */
  private collecting: ReturnType<typeof setTimeout> | undefined;
  private readonly regions = new Regions();
  /** TSNET_STATS: V8's collections on this thread. */
  private readonly gcStats = new GcStats();
  private readonly args = newRecvArgs();
  private readonly threadStats: ThreadStats = { requests: 0, cpuStart: 0, busyStart: 0, started: monoMs() };
  /** TSNET_STATS: what connect and accept calls cost this thread. */
  private readonly setupStats = newSetupStats();

  constructor(
    private readonly host: PluginHost,
    private readonly env: Record<string, string | undefined> = process.env,
  ) {
    this.nextId = 1 + host.thread;
  }

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
    } finally {
      // What it queued for the I/O threads (libfabric's CONNECT, a close's last frames) goes
      // now: no turn may follow soon, and the watchdog's tick flushes only every 50-1000 ms.
      this.transport?.flush();
      // Requests it ended (deregMr, close, finalize) reach the trace now: no turn may follow.
      this.tracer?.flush();
    }
  }

  /** A turn of this thread: count posted requests wait in the mailbox; completions wait in the rings. */
  turn(count: number): void {
    const st = this.steps;
    const entered = st ? this.host.now() : 0;
    if (count) this.requests(count);
    const t = this.transport;
    if (!t) return;
    const handled = st ? this.host.now() : 0;
    st?.started(entered, handled);
    t.poll();
    const polled = st ? this.host.now() : 0;
    // A full submission ring: turn again as soon as the loop comes round, not when a
    // completion or the watchdog happens to wake this thread.
    if (t.flush() && !this.again) {
      this.again = true;
      setImmediate(() => {
        this.again = false;
        try {
          this.turn(0);
        } catch (e) {
          log.warn(`turn after a full submission ring: ${(e as Error).stack ?? e}`);
        }
      });
    }
    st?.flushed(polled, this.host.now());
    this.tracer?.flush();
  }

  private requests(count: number): void {
    const m = this.host.mailbox;
    const stride = this.host.recordStride;
    this.threadStats.requests += count;
    for (let k = 0; k < count; k++) {
      const at = k * stride;
      const op = m[at];
      const commId = m[at + 1];
      const slot = m[at + 2];
      const n = m[at + 3];
      const comm = this.comms.get(commId);
      if (!comm) {
        log.warn(`a request was posted on comm ${commId}, which is closed`);
        continue;
      }
      try {
        const b = at + POST.head;
        if (this.tracer) this.tracer.begin(comm.id, slot, op, m[b + 2], m[at + 4], m[at + 5]);
        if (this.steps) this.steps.begin(comm.id, slot, op, m[at + 4], m[at + 5], m[at + 6] === 1);
        if (op === Op.SEND) {
          const mr = m[b];
          comm.send!.isend(slot, mr ? this.regions.get(mr) : null, m[b + 1], m[b + 2], m[b + 3]);
          continue;
        }
        const a = this.args;
        a.n = n;
        for (let i = 0; i < n; i++) {
          const mr = m[b + POST.buf * i];
          a.regions[i] = mr ? this.regions.get(mr) : null;
          a.offsets[i] = m[b + POST.buf * i + 1];
          a.sizes[i] = m[b + POST.buf * i + 2];
          a.tags[i] = m[b + POST.buf * i + 3];
        }
        if (op === Op.RECV) comm.recv!.irecv(slot, a);
        else if (op === Op.FLUSH) comm.recv!.iflush(slot, a);
        else throw internalError(`operation ${op} does not fit comm ${commId}`);
      } catch (e) {
        const { code, message } = resultOf(e);
        log.warn(`comm ${commId}: ${message}`);
        this.finish(comm, slot, code, ZEROS, 1);
      }
    }
  }

  // Ends a request: its sizes, then its result, then its state (release: test() reads it).
  private finish(comm: Comm, slot: number, code: ResultCode, sizes: ArrayLike<number>, n: number): void {
    const st = comm.status;
    if (!st) return;
    const b = slot * SLOT.ints;
    if (Atomics.load(st, b + SLOT.state) !== SlotState.POSTED) {
      log.warn(`comm ${comm.id}: request slot ${slot} completed but is not in flight`);
      return;
    }
    for (let i = 0; i < n; i++) st[b + SLOT.sizes + i] = sizes[i];
    st[b + SLOT.result] = code;
    Atomics.store(st, b + SLOT.state, code === ResultCode.SUCCESS ? SlotState.DONE : SlotState.FAILED);
    this.tracer?.end(comm.id, slot, code);
    this.steps?.end(comm.id, slot, this.host.now());
  }

  /**
   * Stops the watchdog. A protocol thread has one Plugin for the process's life and never calls
   * this; tests that make many Plugins in one thread do, so that a finished test's watchdog does
   * not warn about the next test's event loop.
   */
  stopWatchdog(): void {
    if (this.watchdog) clearInterval(this.watchdog);
    this.watchdog = undefined;
  }

  // Heartbeats and dead-peer detection for every comm of this thread.
  private startWatchdog(timeoutMs: number): void {
    const every = Math.max(50, Math.min(1000, timeoutMs / 4));
    let last = monoMs();
    let lostWarned = -Infinity;
    let was = this.holdSample();
    let judged = true;
    this.watchdog = setInterval(() => {
      const now = monoMs();
      const late = now - last - every;
      last = now;
      const is = this.holdSample();
      if (late >= timeoutMs / 2)
        log.warn(`protocol thread ${this.host.thread}: its event loop was held for ${late} ms (the watchdog ran that late): requests and completions waited that long; ${holdLine(late, was, is)}`);
      was = is;
      // Work that waits with no wake-up on its way and no turn for a tick was never announced to
      // this thread: it would wait for a turn that other work happens to cause.
      const w = this.host.wakeState?.();
      if (w && w.work && !w.pending && !w.readable && !w.spinning && w.sinceTurnMs >= every) {
        this.lostWakes++;
        this.host.wakeSelf?.(); // posted requests too: this tick's turn below takes completions only
        if (now - lostWarned >= 10_000) {
          lostWarned = now;
          log.warn(`protocol thread ${this.host.thread}: work waited ${Math.round(w.sinceTurnMs)} ms with no wake-up on its way (${this.lostWakes} time(s) so far); the watchdog wakes the thread`);
        }
      }
      // Completions that wait are handed to their comms before any comm is judged quiet: a
      // late or lost wake-up costs this tick's wait, never a comm.
      this.turn(0);
      // After a tick or more held, what waits in this thread's own sockets (Node's: connects,
      // greetings) comes only in the loop's next pass, since libuv runs timers first; and a
      // process that was given no CPU had its I/O threads held too. So no comm, connect or
      // greeting is judged at such a tick (heartbeats still go), never twice in a row: a loop
      // late at every tick still judges at every other one.
      const judge = late < every || !judged;
      judged = judge;
      for (const c of this.comms.values()) c.endpoint.tick(now, timeoutMs, judge);
      for (const a of this.connecting.values()) a.c.tick?.(now, timeoutMs, judge);
      for (const l of this.listeners.values()) l.listener.tick?.(now, timeoutMs, judge);
      this.transport?.tick?.(now, timeoutMs, judge);
      this.transport?.flush();
      this.adaptSpin();
    }, every).unref();
  }

  /** What this thread has done so far, for the watchdog's WARN on a held loop (holdLine). */
  private holdSample(): HoldSample {
    return { cpu: this.host.threadCpu(), busy: this.host.busy(), wait: this.host.runWait?.() ?? -1, longest: this.host.longest?.() };
  }

  /**
   * TSNET_SPIN_MAX_US, once per watchdog tick: the busy-poll windows follow how late this
   * thread, and (thread 0) the I/O threads, woke when asked to (plugin/spin.ts). Each change
   * is a TRACE line: at INFO they came in the middle of the job's own output (nccl-tests' rows
   * were cut in two under NCCL_DEBUG=INFO).
   */
  adaptSpin(): void {
    if (this.spinSelf) {
      const s = this.spinSelf.next([this.host.wakes()]);
      if (s.why) {
        this.host.setSpin(s.us);
        log.trace(() => `busy-poll window of protocol thread ${this.host.thread}: ${s.us} us (${s.why})`);
      }
    }
    if (this.spinIo) {
      const s = this.spinIo.next(this.host.ioWakes());
      if (s.why) {
        this.host.ioSetSpin(s.us);
        log.trace(() => `busy-poll window of the I/O threads: ${s.us} us (${s.why})`);
      }
    }
  }

  private id(): number {
    const id = this.nextId;
    this.nextId += ID_STEP;
    if (this.nextId > 0xffff_ffff) this.nextId = 1 + this.host.thread;
    return id;
  }

  private need<T>(map: Map<number, T>, id: unknown, what: string): T {
    const v = map.get(id as number);
    if (!v) throw invalidArgument(`no ${what} ${id}`);
    return v;
  }

  private device(dev: unknown): number {
    const t = this.started();
    if (typeof dev !== 'number' || !Number.isInteger(dev) || dev < 0 || dev >= t.devices.length)
      throw invalidArgument(`device ${dev} does not exist (tsnet has ${t.devices.length}: 0 to ${t.devices.length - 1})`);
    return dev;
  }

  // The configuration and transport of this thread: thread 0 makes them at the first init;
  // the other threads at their first call (the core sends them no init).
  private started(): Transport {
    if (this.transport) return this.transport;
    const { config, lines } = readConfig(this.env);
    const first = this.host.thread === 0;
    if (first) for (const l of lines) log.info(`config: ${l}`);
    if (first && config.protocolThreads > 1) this.host.startThreads(config.protocolThreads);
    this.host.setSpin(config.spinUs);
    if (config.spinMaxUs > 0) {
      this.spinSelf = new SpinAdapter(config.spinUs, config.spinMaxUs);
      if (first) this.spinIo = new SpinAdapter(config.spinUs, config.spinMaxUs);
    }
    this.transport = this.host.makeTransport(config, this.regions);
    this.config = config;
    if (config.traceFile) {
      if (this.host.traceOpen(config.traceFile)) this.tracer = new Tracer(this.host, this.host.thread);
      else log.warn(`TSNET_TRACE=${config.traceFile}: the file cannot be written; no trace`);
    }
    if (config.statsSteps) {
      this.host.timestamps();
      this.steps = new StepStats(this.host.slotsPerComm);
    }
    if (config.stats) this.gcStats.start();
    this.threadStats.cpuStart = this.host.threadCpu();
    this.threadStats.busyStart = this.host.busy();
    this.startWatchdog(config.timeoutSec * 1000);
    if (first) log.info(`transport ${this.transport.name}, ${this.transport.devices.length} device(s), ${config.protocolThreads} protocol thread(s)`);
    return this.transport;
  }

  private newComm(ctx: number, dev: number, endpoint: SendComm | RecvComm, send: boolean): number {
    const id = this.id();
    this.comms.set(id, { id, ctx, dev, endpoint, send: send ? (endpoint as SendComm) : undefined, recv: send ? undefined : (endpoint as RecvComm), status: undefined, opened: monoMs() });
    return id;
  }

  private hooks(id: number) {
    // Completions of a closed comm go nowhere: NCCL no longer holds its requests.
    return {
      name: `comm ${id}`,
      complete: (slot: number, code: ResultCode, sizes: ArrayLike<number>, n: number) => {
        const c = this.comms.get(id);
        if (c) this.finish(c, slot, code, sizes, n);
      },
    };
  }

  private closeComm(comm: Comm): void {
    comm.endpoint.close();
    this.comms.delete(comm.id);
    this.steps?.forget(comm.id);
    if (this.config?.stats) log.info(commStatsLine(comm.id, comm.send ? 'send' : 'receive', comm.endpoint.stats, monoMs() - comm.opened));
    if (!this.comms.size) this.idleCollect();
  }

  /**
   * This thread's last comm closed (NCCL destroyed its communicators, or the warm-up ended):
   * a full collection IDLE_COLLECT_MS later, if no comm was opened meanwhile. A closed comm's
   * receive ring and registered buffers are native memory held by JavaScript views; nothing
   * else would make V8 collect them once the traffic, and with it the allocation, has stopped.
   * With the rings mapped pages, 512 TCP pairs closed left 73-77 MiB more than before them
   * resident, against 175-204 before (docs/performance.md, item 40's table). One ordinary
   * collection (never a memory-reducing one, which ages compiled code faster), after the close
   * has returned; `gc` is exposed in tsnet's own isolate only (embed/host.cc).
   */
  private idleCollect(): void {
    const gc = (globalThis as { gc?: () => void }).gc;
    if (!gc || this.collecting) return;
    this.collecting = setTimeout(() => {
      this.collecting = undefined;
      if (this.comms.size) return;
      const t0 = monoMs();
      gc();
      if (this.config?.stats) log.info(`stats: protocol thread ${this.host.thread}: its last comm closed; a garbage collection took ${monoMs() - t0} ms`);
    }, IDLE_COLLECT_MS);
    this.collecting.unref?.();
  }

  private readonly ops: Record<string, (a: Args) => Answer> = {
    init: (a) => {
      this.started();
      const id = this.id();
      this.ctxs.add(id);
      log.info(
        a.legacy ? `context ${id}: the process-wide context of ncclNet v6-v10` : `context ${id} for communicator 0x${(a.commId as bigint).toString(16)}`,
      );
      // The core warms the data path up once, after the process's first init (TSNET_WARMUP).
      const warmup = this.warmupAsked ? 0 : this.config!.warmup;
      this.warmupAsked = true;
      return { ctx: id, warmup };
    },

    devices: () => ({ ndev: this.started().devices.length }),

    getProperties: (a) => {
      const t = this.started();
      const dev = this.device(a.dev);
      return { props: propertiesOf(dev, t.devices[dev], t.traits) };
    },

    listen: (a) => {
      const t = this.started();
      const listener = t.listen(this.device(a.dev));
      const id = this.id();
      this.ctxs.add(a.ctx as number); // the core checked it; other threads learn it here
      this.listeners.set(id, { ctx: a.ctx as number, dev: a.dev as number, listener });
      return { listen: id, handle: listener.handle };
    },

    connect: (a) => {
      const t = this.started();
      const dev = this.device(a.dev);
      const handle = a.handle as Uint8Array;
      this.ctxs.add(a.ctx as number);
      // NCCL retries with the same handle until the comm is up: the handle names the attempt.
      const key = `${a.ctx}/${dev}/${Buffer.from(handle).toString('hex')}`;
      const st = this.config?.stats ? this.setupStats : undefined;
      const t0 = st ? this.host.now() : 0;
      let at = this.connecting.get(key);
      if (!at) this.connecting.set(key, (at = { c: t.connect(dev, handle), since: t0 }));
      const c = at.c;
      let comm: SendComm | undefined;
      const id = this.nextId;
      try {
        comm = c.poll(this.hooks(id));
      } catch (e) {
        this.connecting.delete(key);
        c.close();
        throw e;
      } finally {
        if (st) {
          st.connectCalls++;
          st.connectUs += this.host.now() - t0;
        }
      }
      if (!comm) return { comm: 0 };
      this.connecting.delete(key);
      if (this.newComm(a.ctx as number, dev, comm, true) !== id) throw internalError('comm ids went out of step');
      if (st) {
        st.connected.add(this.host.now() - at.since);
        const tm = c.timing;
        if (tm?.ready !== undefined) {
          st.connectHandshakes.add((tm.ready - tm.begun) * 1000);
          st.connectWaits.add((performance.now() - tm.ready) * 1000);
        } else if (tm) {
          // Given before ready (TSNET_CONNECT_EARLY): its handshake is timed when it ends.
          st.connectEarly++;
          tm.onReady = (ready) => st.connectHandshakes.add((ready - tm.begun) * 1000);
        }
      }
      log.info(`comm ${id}: connected`);
      return { comm: id };
    },

    accept: (a) => {
      const l = this.need(this.listeners, a.listen, 'listen comm');
      const id = this.nextId;
      const st = this.config?.stats ? this.setupStats : undefined;
      const t0 = st ? this.host.now() : 0;
      let comm: RecvComm | undefined;
      try {
        comm = l.listener.accept(this.hooks(id));
      } finally {
        if (st) {
          st.acceptCalls++;
          st.acceptUs += this.host.now() - t0;
        }
      }
      if (!comm) return { comm: 0 };
      if (st) {
        st.accepted++;
        const last = l.listener.lastAccept;
        if (last) {
          st.handshakes.add(last.handshakeUs);
          st.waits.add(last.waitedUs);
        }
      }
      if (this.newComm(l.ctx, l.dev, comm, false) !== id) throw internalError('comm ids went out of step');
      log.info(`comm ${id}: accepted`);
      return { comm: id };
    },

    attach: (a) => {
      const comm = this.need(this.comms, a.comm, 'comm');
      comm.status = new Int32Array(a.status as ArrayBuffer);
      comm.endpoint.trace = bothTraces(this.tracer?.forComm(comm.id), this.steps?.forComm(comm.id));
      comm.endpoint.start();
      return {};
    },

    // regMr, and regMrDmaBuf (fd and offset given).
    regMr: (a) => {
      const t = this.started();
      const comm = this.need(this.comms, a.comm, 'comm');
      const type = a.type as number;
      const fd = a.fd as number | undefined;
      const what = fd === undefined ? 'regMr' : 'regMrDmaBuf';
      const support = t.traits.ptrSupport;
      if (!(type & support) || type & ~support)
        throw invalidArgument(
          `${what}: memory type 0x${type.toString(16)} (${PTR_NAMES[type] ?? 'unknown'}) is not supported; ` +
            `tsnet registers ${ptrNames(support)} memory (0x${support.toString(16)})`,
        );
      if (fd !== undefined && !(support & PtrKind.DMABUF))
        throw invalidArgument(
          `regMrDmaBuf: tsnet over ${this.config!.transport} registers no memory through DMA-BUF here ` +
            `(ptrSupport 0x${support.toString(16)}: ${ptrNames(support)}); the INFO lines at init say why`,
        );
      if (fd !== undefined && type !== PtrKind.CUDA)
        throw invalidArgument(`regMrDmaBuf: memory type 0x${type.toString(16)} (${PTR_NAMES[type] ?? 'unknown'}): a DMA-BUF is registered as GPU memory (CUDA, 0x2)`);
      const id = this.id();
      // GPU memory comes without a view: JavaScript never touches it.
      const region = this.regions.add(id, comm.id, (a.buffer as ArrayBuffer | undefined) ?? null, a.base as number, a.size as number);
      region.dev = comm.dev;
      // NCCL closes the fd once this returns: the transport registers through it now, never later.
      if (fd !== undefined) region.dmabuf = { fd, offset: a.offset as number };
      try {
        t.register?.(region, comm.dev);
      } catch (e) {
        this.regions.delete(id);
        throw e;
      } finally {
        region.dmabuf = undefined;
      }
      return { mr: id };
    },

    deregMr: (a) => {
      const r = this.regions.delete(a.mr as number);
      if (!r) throw invalidArgument(`deregMr: no region ${a.mr}`);
      // Nothing may touch the memory once NCCL has it back: requests using it end now.
      const comm = this.comms.get(r.comm);
      const n = comm ? comm.endpoint.cancelRegion(r as Region) : 0;
      if (n) log.info(`deregMr: comm ${r.comm}: ${n} request(s) in flight on the region were cancelled`);
      this.transport?.deregister?.(r as Region, r.dev);
      return {};
    },

    close: (a) => {
      this.closeComm(this.need(this.comms, a.comm, 'comm'));
      return {};
    },

    closeListen: (a) => {
      const l = this.need(this.listeners, a.listen, 'listen comm');
      l.listener.close();
      this.listeners.delete(a.listen as number);
      return {};
    },

    finalize: (a) => {
      const ctx = a.ctx as number;
      // Only this context's leftovers go; other communicators keep theirs.
      for (const c of [...this.comms.values()].filter((c) => c.ctx === ctx)) this.closeComm(c);
      for (const [id, l] of [...this.listeners].filter(([, l]) => l.ctx === ctx)) {
        l.listener.close();
        this.listeners.delete(id);
      }
      // Connects NCCL will not retry: left alone they would finish into a link nobody closes.
      for (const [key, { c }] of [...this.connecting].filter(([k]) => k.startsWith(`${ctx}/`))) {
        c.close();
        this.connecting.delete(key);
      }
      this.ctxs.delete(ctx);
      if (!this.ctxs.size && !this.comms.size && !this.listeners.size && !this.connecting.size) this.transport?.release?.();
      if (this.config?.stats) {
        log.info(threadStatsLine(this.host.thread, this.threadStats, this.host.threadCpu(), this.host.busy(), this.host.sentHere?.()));
        log.info(wakeStatsLine(`protocol thread ${this.host.thread}`, [this.host.wakes()]));
        for (const line of setupStatsLines(this.host.thread, this.setupStats)) log.info(line);
        const calls = this.host.controlCalls?.();
        if (calls?.length) log.info(controlCallsLine(this.host.thread, calls));
        log.info(gcStatsLine(this.host.thread, this.gcStats.counts, process.memoryUsage()));
        const early = this.host.earlyWakes?.();
        if (early !== undefined && this.config.earlyWake) log.info(`stats: protocol thread ${this.host.thread}: early wake-ups ${early} (woken by a lane with its I/O thread)`);
        if (this.lostWakes) log.info(`stats: protocol thread ${this.host.thread}: the watchdog found work no wake-up had announced ${this.lostWakes} time(s)`);
        for (const line of this.steps?.lines(this.host.thread) ?? []) log.info(line);
        if (this.host.thread === 0) {
          const io = this.host.ioCpu();
          if (io.length) log.info(`stats: I/O threads CPU ${io.map((us) => `${(us / 1e6).toFixed(3)} s`).join(', ')}`);
          const wakes = this.host.ioWakes();
          if (wakes.length) log.info(wakeStatsLine(`${wakes.length} I/O thread(s)`, wakes));
          const cpu = this.host.processCpu?.();
          if (cpu?.threads.length) log.info(processCpuLine(cpu.threads, cpu.processUs));
        }
      }
      return {};
    },

    setNetAttr: (a) => {
      log.trace(() => `setNetAttr: ${JSON.stringify(a)}`);
      return {};
    },
  };
}
