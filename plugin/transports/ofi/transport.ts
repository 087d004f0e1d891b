// The libfabric transport as the plugin sees it (TSNET_TRANSPORT=ofi): one NCCL device per NIC
// (or per group of NICs: TSNET_DEVICE_GROUPS, by domain name), properties from fi_info, and per
// protocol thread one OfiEndpoint per device over NativeRails, made at first use. Comms of the
// RDMA protocol (send-comm.ts, recv-comm.ts) are wrapped into the plugin's comm interface.
import { PtrKind, ResultCode } from '../../abi';
import { objectArray } from '../../arrays';
import type { Config } from '../../config';
import type { Port } from '../../engine/port';
import { type NetError, invalidArgument, invalidUsage, systemError } from '../../errors';
import { monoMs } from '../../clock';
import { log } from '../../log';
import type { Region } from '../../memory';
import type { CommStats, RequestTrace } from '../../protocol/endpoint';
import type { RecvArgs } from '../../protocol/receiver';
import { groupGuid } from '../guid';
import type { CommHooks, Connector, Device, Listener, RecvComm, SendComm, Traits, Transport } from '../transport';
import type { OfiConfig } from './config';
import { MAX_RECVS } from './wire';
import { OfiEndpoint } from './endpoint';
import type { Complete, OnCompletions, RecvComm as OfiRecv, Registration, ReqBuf, SendComm as OfiSend } from './fabric';
import { NativeRail, type OfiBinding, type OfiNicInfo } from './native-rail';
import { deviceRails, nicOf } from './policy/rails';

/** The engine's answer to ofiOpen, read once per process (thread 0 logs it). */
export type OfiOpened = ReturnType<OfiBinding['ofiOpen']>;

/**
 * Deregistering memory that requests in flight use lets them end first: for as long as the
 * comm's requests keep ending, until none of them did for DRAIN_MS, and DRAIN_MAX_MS at most
 * (ms). NCCL gives memory back only once its requests are done, except when it aborts: then
 * each comm with requests in flight on the memory waits about DRAIN_MS once, before it fails.
 */
export const DRAIN_MS = 250;
export const DRAIN_MAX_MS = 2000;
const pause = new Int32Array(new SharedArrayBuffer(4));

// Requests are tracked per slot (NCCL's pool) to tell which use a region. The buffers a request
// is described by are reused per slot and buffer count: the RDMA comms copy what they need
// before isend/irecv/iflush returns, and NCCL reuses a slot only after its request ended. A new
// object and array per request, and a Map of them, made about 750 bytes of garbage per message
// (performance.md, item 18).
export class Wrapped {
  readonly stats: CommStats = { messages: 0, bytes: 0 };
  /** Per slot: the buffers of its request in flight, or undefined. */
  protected readonly inflight: (ReqBuf[] | undefined)[] = [];
  /** Per slot and buffer count (slot * (MAX_RECVS + 1) + n): the arrays handed to the comm. */
  private readonly arrays: (ReqBuf[] | undefined)[] = [];
  protected failedWith: NetError | undefined;

  constructor(
    protected readonly comm: OfiSend | OfiRecv,
    private readonly name: string,
    /** One round of the thread's turn: completions taken, submissions published. */
    private readonly pump?: () => void,
  ) {}

  /** The completion callback the RDMA comm reports to: forgets the slot, then tells the plugin. */
  static complete(w: () => Wrapped | undefined, hooks: CommHooks): Complete {
    return (slot, code, sizes) => {
      const me = w();
      if (me && slot < me.inflight.length) me.inflight[slot] = undefined;
      hooks.complete(slot, code, sizes, sizes.length);
    };
  }

  get pending(): number {
    return this.comm.pending;
  }

  /** TSNET_TRACE: the RDMA comm records the steps its completions time. */
  get trace(): RequestTrace | undefined {
    return this.comm.trace;
  }

  set trace(t: RequestTrace | undefined) {
    this.comm.trace = t;
  }

  start(): void {}
  /** The endpoint ticks its comms (OfiTransport.tick). */
  tick(): void {}

  close(): void {
    this.comm.close();
    this.inflight.fill(undefined);
  }

  fail(err: NetError): void {
    this.comm.fail(err);
  }

  /**
   * RDMA cannot take back what the peer was told of a buffer (its address and key). Requests in
   * flight on the region first get to end (drain: completions are taken meanwhile), so that the
   * peer's writes already on their way land while the memory is still registered. Those still
   * in flight then end the comm, so that nothing waits on memory NCCL takes back.
   */
  cancelRegion(region: Region): number {
    let n = this.using(region);
    if (n && this.pump && !this.comm.failed) n = this.drain(region);
    if (!n) return 0;
    const all = this.comm.pending;
    log.info(`${this.name}: memory of ${n} request(s) in flight was deregistered; the comm ends (${all} request(s) fail)`);
    this.comm.fail(invalidUsage(`${this.name}: the memory of a request in flight was deregistered`));
    return all;
  }

  /** Requests in flight on the region. */
  private using(region: Region): number {
    let n = 0;
    for (const bufs of this.inflight) if (bufs?.some((b) => b.region === region)) n++;
    return n;
  }

  /**
   * Takes completions and publishes submissions until no request in flight uses the region or
   * the comm fails; gives up once DRAIN_MS pass with none of the comm's requests ending (the
   * peer is not sending, or not receiving), and after DRAIN_MAX_MS in all. Without it, a write
   * the peer had posted before the memory was deregistered finds no registration: shm then
   * drops it without a completion, and the peer's endpoint keeps a slot for it for good
   * (docs/ofi-facts.md); enough of them stall its sends.
   */
  private drain(region: Region): number {
    const start = monoMs();
    let until = start + DRAIN_MS;
    let pending = this.comm.pending;
    for (;;) {
      this.pump!();
      const n = this.using(region);
      if (!n || this.comm.failed) return n;
      const now = monoMs();
      if (this.comm.pending < pending) {
        pending = this.comm.pending;
        until = now + DRAIN_MS;
      }
      if (now >= until || now - start >= DRAIN_MAX_MS) return n;
      Atomics.wait(pause, 0, 0, 0.05);
    }
  }

  /** The reusable array of n buffers of a slot. */
  protected bufsOf(slot: number, n: number): ReqBuf[] {
    // Out of range (the comm refuses it with a WARN): an array of its own.
    if (n < 0 || n > MAX_RECVS) return Array.from({ length: n }, () => ({ region: null as never, offset: 0, size: 0, tag: 0 }));
    const k = slot * (MAX_RECVS + 1) + n;
    while (this.arrays.length <= k) this.arrays.push(undefined);
    let a = this.arrays[k];
    if (!a) {
      a = objectArray<ReqBuf>();
      for (let i = 0; i < n; i++) a.push({ region: null as never, offset: 0, size: 0, tag: 0 });
      this.arrays[k] = a;
    }
    return a;
  }

  protected track(slot: number, bufs: ReqBuf[]): void {
    while (this.inflight.length <= slot) this.inflight.push(undefined);
    this.inflight[slot] = bufs;
  }
}

export class WrappedSend extends Wrapped implements SendComm {
  isend(slot: number, region: Region | null, offset: number, size: number, tag: number): void {
    const bufs = this.bufsOf(slot, 1);
    const buf = bufs[0];
    buf.region = region as never;
    buf.offset = offset;
    buf.size = size;
    buf.tag = tag;
    this.track(slot, bufs);
    this.stats.messages++;
    this.stats.bytes += size;
    (this.comm as OfiSend).isend(slot, buf);
  }
}

export class WrappedRecv extends Wrapped implements RecvComm {
  irecv(slot: number, a: RecvArgs): void {
    const bufs = this.bufs(slot, a);
    this.track(slot, bufs);
    this.stats.messages += a.n;
    (this.comm as OfiRecv).irecv(slot, bufs);
  }

  iflush(slot: number, a: RecvArgs): void {
    (this.comm as OfiRecv).iflush(slot, this.bufs(slot, a));
  }

  private bufs(slot: number, a: RecvArgs): ReqBuf[] {
    const out = this.bufsOf(slot, a.n);
    for (let i = 0; i < a.n; i++) {
      const b = out[i];
      b.region = a.regions[i] as never;
      b.offset = a.offsets[i];
      b.size = a.sizes[i];
      b.tag = a.tags[i];
    }
    return out;
  }
}

interface OfiDevice extends Device {
  /** Indices of its NICs in ofiOpen's list: its rails. */
  nics: number[];
}

export class OfiTransport implements Transport {
  readonly name = 'ofi';
  readonly traits: Traits;
  readonly devices: OfiDevice[];
  private readonly endpoints: (OfiEndpoint | undefined)[];
  /** TSNET_OFI_GPU_IPC: reasons already logged why memory could not be shared by CUDA IPC. */
  private readonly ipcRefused = new Set<string>();
  /** The INFO line of the first DMA-BUF registration was said. */
  private dmabufSeen = false;
  /** The native rails of each device's endpoint (closed by release). */
  private readonly railsOf: NativeRail[][];
  private portRef: Port | undefined;

  constructor(
    private readonly config: Config,
    private readonly ofi: OfiConfig,
    private readonly binding: OfiBinding,
    private readonly opened: OfiOpened,
    private readonly port: () => Port,
    latencyUs: number,
  ) {
    const nics = opened.nics;
    this.devices = groups(nics, config.deviceGroups).map((members) => {
      const list = members.map((i) => nics[i]);
      return {
        name: list.map((n) => n.domain).join('+'),
        pciPath: list[0].pciPath || null,
        guid: list.length === 1 ? list[0].guid : groupGuid(list.map((n) => n.guid)),
        // Neither tcp nor shm knows its link speed: NCCL's Socket default then.
        speedMbps: list.reduce((s, n) => s + (n.speedMbps > 0 ? n.speedMbps : 10000), 0),
        rails: list.length,
        nics: members,
      };
    });
    const hmem = nics.every((n) => n.hmem);
    const dmabuf = hmem && ofi.dmabuf && nics.every((n) => n.dmabuf);
    this.traits = {
      ptrSupport: PtrKind.HOST | (hmem ? PtrKind.CUDA : 0) | (dmabuf ? PtrKind.DMABUF : 0),
      maxRecvs: 8,
      regIsGlobal: false,
      forceFlush: false,
      maxComms: 32767,
      latencyUs,
      maxP2pBytes: 1 << 30,
      maxCollBytes: 1 << 30,
    };
    this.endpoints = this.devices.map(() => undefined);
    this.railsOf = this.devices.map(() => []);
  }

  /** INFO lines of discovery (thread 0 logs them). dmabuf: whether it was asked for (OFI_NCCL_DISABLE_DMABUF). */
  static describe(opened: OfiOpened, dmabuf = true): string[] {
    const lines = [`ofi: ${opened.version}, provider ${opened.nics[0].provider}, ${opened.progress}`];
    for (const n of opened.nics) lines.push(`ofi: NIC ${n.domain}: ${n.describe}`);
    const nic = opened.nics[0];
    if (!nic.hmem) lines.push(`ofi: host memory only: ${nic.hmemWhy || 'the provider offers no FI_HMEM'}`);
    else if (nic.noCudaApi) lines.push('ofi: GPU memory is registered directly (FI_HMEM, CUDA); libfabric makes no CUDA call (FI_OPT_CUDA_API_PERMITTED)');
    else lines.push(`ofi: GPU memory is registered directly (FI_HMEM, CUDA), and ${nic.provider} calls CUDA on tsnet's I/O threads (TSNET_OFI_CUDA_API=1): this can deadlock with the application's CUDA calls`);
    if (nic.hmem) lines.push(dmabufLine(opened.nics, dmabuf));
    if (nic.hmem && !nic.mixedIov)
      lines.push(`ofi: ${opened.version} cannot gather host and GPU memory in one send: sends from GPU memory are not sent eager (libfabric 1.18 can)`);
    return lines;
  }

  private ep(dev: number): OfiEndpoint {
    let ep = this.endpoints[dev];
    if (ep) return ep;
    const d = this.devices[dev];
    const port = (this.portRef ??= this.port());
    const rails: NativeRail[] = [];
    const onCompletions: OnCompletions = (rail, batch) => ep!.onCompletions(rail, batch);
    try {
      // One endpoint per rail, a NIC repeated (OFI_NCCL_FORCE_NUM_RAILS above the NIC count)
      // included: each endpoint has an I/O thread of its own, and a provider whose progress
      // moves the bytes (shm copies each write in the target's completion-queue poll) copies
      // a striped message on as many threads as the comm has rails.
      const count = deviceRails(d.nics.length, this.ofi.forceRails);
      for (let i = 0; i < count; i++) {
        const nic = d.nics[nicOf(i, d.nics.length)];
        // The rails share their threads' busy-poll window (a comm's messages take turns over them).
        rails.push(new NativeRail(port, this.binding, nic, this.opened.nics[nic], i, onCompletions, rails[0]?.group ?? 0));
      }
      ep = new OfiEndpoint(rails, {
        config: this.ofi,
        name: `ofi ${d.name}`,
        timeoutMs: this.config.timeoutSec * 1000,
        gpuEager: d.nics.every((i) => this.opened.nics[i].mixedIov),
        watchPeers: true,
      });
    } catch (e) {
      rails.forEach((r) => r.close());
      throw e;
    }
    this.endpoints[dev] = ep;
    this.railsOf[dev] = rails;
    log.info(`ofi ${d.name}: ${railsLine(rails, d.nics.length)}`);
    return ep;
  }

  listen(dev: number): Listener {
    const l = this.ep(dev).listen();
    return {
      handle: l.handle,
      accept: (hooks) => {
        let w: WrappedRecv | undefined;
        const c = l.accept(Wrapped.complete(() => w, hooks));
        return c && (w = new WrappedRecv(c, hooks.name, this.pump));
      },
      close: () => l.close(),
      get lastAccept() {
        return l.lastAccept;
      },
    };
  }

  connect(dev: number, handle: Uint8Array): Connector {
    const c = this.ep(dev).connect(handle);
    return {
      poll: (hooks) => {
        let w: WrappedSend | undefined;
        const s = c.poll(Wrapped.complete(() => w, hooks));
        return s && (w = new WrappedSend(s, hooks.name, this.pump));
      },
      close: () => (c as unknown as { close?: () => void }).close?.(),
      get timing() {
        return c.timing;
      },
    };
  }

  register(region: Region, dev: number): void {
    const ep = this.ep(dev);
    const ipc = this.ofi.gpuIpc && region.kind === 'cuda';
    const regs: Registration[] = [];
    const local: Registration[] = [];
    let shared = false;
    try {
      // A DMA-BUF's fd is valid during this call only: every rail registers through it now.
      for (const r of ep.rails) regs.push(r.regMr(region.base, region.size, region.kind, ipc, region.dmabuf));
      // The answer is the pointer's, the same on every NIC.
      shared = ipc && regs.every((g) => g.ipc !== false);
      if (ipc && !shared) {
        // Memory CUDA IPC cannot export got plain registrations: it moves through host memory.
        const why = regs.find((g) => g.ipc === false)?.ipcWhy ?? 'not exportable';
        if (!this.ipcRefused.has(why)) {
          this.ipcRefused.add(why);
          log.info(`ofi: TSNET_OFI_GPU_IPC: ${region.size} bytes of GPU memory at 0x${region.base.toString(16)} cannot be shared by CUDA IPC (${why}); such memory moves through host memory`);
        }
      }
      if (shared) for (const r of ep.rails) local.push(r.regMr(region.base, region.size, region.kind, false, region.dmabuf));
    } catch (e) {
      regs.forEach((reg, i) => ep.rails[i].deregMr(reg));
      local.forEach((reg, i) => ep.rails[i].deregMr(reg));
      throw e;
    }
    region.regs = regs;
    region.localRegs = shared ? local : undefined;
    if (region.dmabuf && !this.dmabufSeen) {
      this.dmabufSeen = true;
      log.info(`ofi: GPU memory registered through DMA-BUF (NCCL's regMrDmaBuf: ${region.size} bytes at offset ${region.dmabuf.offset} of fd ${region.dmabuf.fd}); said once per protocol thread`);
    }
  }

  deregister(region: Region, dev: number): void {
    const ep = this.endpoints[dev];
    if (!ep) return;
    region.regs.forEach((reg, i) => ep.rails[i].deregMr(reg as never));
    (region.localRegs as Registration[] | undefined)?.forEach((reg, i) => ep.rails[i].deregMr(reg));
    region.regs = [];
    region.localRegs = undefined;
  }

  poll(): void {
    this.portRef?.poll();
  }

  private readonly pump = (): void => {
    this.portRef?.poll();
    this.portRef?.flush();
  };

  flush(): boolean {
    this.portRef?.flush();
    return this.portRef?.backlog ?? false;
  }

  tick(now: number, timeoutMs: number, judge = true): void {
    for (const ep of this.endpoints) ep?.tick(now, timeoutMs, judge);
    for (const rails of this.railsOf) for (const r of rails) if (r.deregsPending) r.retryDeregs(now, timeoutMs);
    const stalled = stallWarnings(this.binding, this.opened.nics[0].provider, timeoutMs);
    for (const line of stalled) log.warn(line);
    if (stalled.length && this.config.stallStacks) {
      const line = stallStacksLine(this.binding, this.config.stallStacks);
      if (line) log.warn(line);
    }
  }

  release(): void {
    this.endpoints.forEach((ep, dev) => {
      if (!ep) return;
      this.endpoints[dev] = undefined;
      const { foreign, unnamed, peerClosed, refused, staleMessages, staleWrites } = ep.stats;
      if (foreign || unnamed)
        log.info(`${ep.name}: ${foreign} message(s) and write(s) from senders that were not the named comm's peer were dropped; ${unnamed} named AV id 0 (not known to the provider) passed`);
      if (peerClosed || refused || staleMessages || staleWrites)
        log.info(`${ep.name}: ${peerClosed} comm(s) heard their peer's CLOSE; ${refused} CONNECT(s) refused; ${staleMessages} message(s) and ${staleWrites} write(s) for comms already closed dropped`);
      ep.close();
      for (const r of this.railsOf[dev]) r.close();
      ep.freeMemory();
      this.railsOf[dev] = [];
    });
    this.portRef?.flush();
    const lines = abandonedLines(this.binding, Math.min(ABANDONED_WAIT_MS, this.config.timeoutSec * 500));
    if (lines.info) log.info(lines.info);
    if (lines.warn) log.warn(lines.warn);
  }
}

/** How long the last finalize waits, at most, for endpoints whose close gave up on a stuck I/O thread. */
export const ABANDONED_WAIT_MS = 5000;

/**
 * At the last finalize: waits up to ms for the I/O threads to close the endpoints whose close
 * gave up on them (an I/O thread inside libfabric for half the link timeout: cancelLane). The
 * process may end right after (a benchmark's _exit, NCCL's end of job): an endpoint still open
 * then leaves shm's 16 MiB region in /dev/shm when the process skips its exit handlers.
 */
export function abandonedLines(binding: Pick<OfiBinding, 'ofiAwaitAbandoned'>, ms: number, now: () => number = monoMs): { info?: string; warn?: string } {
  if (!binding.ofiAwaitAbandoned || binding.ofiAwaitAbandoned(0) === 0) return {};
  const t0 = now();
  const left = binding.ofiAwaitAbandoned(ms);
  const waited = Math.round(now() - t0);
  if (left === 0) return { info: `ofi: the last finalize waited ${waited} ms for I/O threads to close the endpoints whose close had given up on them; all are closed` };
  return {
    warn:
      `ofi: ${left} endpoint(s) whose close gave up on an I/O thread stuck inside libfabric are still open ${waited} ms after the last finalize; ` +
      'the thread closes them when it comes back, and a process that ends first (_exit, a signal) leaves their shm regions in /dev/shm',
  };
}

/**
 * WARN lines for I/O threads stuck inside one libfabric (or CUDA) call for half the link
 * timeout: such a call cannot be ended from outside, and the comms whose endpoints that thread
 * owns fail when their peers' silence reaches the timeout. Each stall is reported once, to one
 * protocol thread (the engine keeps track).
 */
export function stallWarnings(binding: Pick<OfiBinding, 'ioStalls'>, provider: string, timeoutMs: number): string[] {
  const stalls = binding.ioStalls?.(Math.max(1000, timeoutMs / 2)) ?? [];
  return stalls.map(
    (s) =>
      `ofi: I/O thread ${s.thread} has been inside ${s.call} (lane ${s.lane}, ${provider}) for ${(s.ms / 1000).toFixed(1)} s and most likely ` +
      `will not return: nothing outside the call can end it, and the comms on its endpoints fail when their peers stay silent for ` +
      `${(timeoutMs / 1000).toFixed(0)} s. Seen with shm: a CUDA call inside libfabric waiting on a lock the application holds ` +
      `(TSNET_OFI_CUDA_API=1), and a lock held by a killed peer (docs/ofi-facts.md); TSNET_STALL_STACKS=<file> writes every thread's stack then`,
  );
}

let STACKS_DUMPED = false;

/**
 * TSNET_STALL_STACKS: every thread's stack, once per process, when the first stall is reported;
 * the WARN line that says where they went, or undefined when they were written already.
 */
export function stallStacksLine(binding: Pick<OfiBinding, 'dumpStacks'>, file: string): string | undefined {
  if (STACKS_DUMPED || !binding.dumpStacks) return undefined;
  STACKS_DUMPED = true;
  try {
    const d = binding.dumpStacks(file);
    return `ofi: the stacks of this process's ${d.threads} threads are in ${d.file} (TSNET_STALL_STACKS; ${d.answered} of them answered: a thread that blocks the signal cannot)`;
  } catch (e) {
    return `ofi: TSNET_STALL_STACKS: ${(e as Error).message}`;
  }
}

let OPENED: OfiOpened | undefined;

/**
 * Opens libfabric (once per process) for the transport; the answer names the NICs. cudaApi:
 * GPU memory even through a provider that calls CUDA inside libfabric (TSNET_OFI_CUDA_API).
 * source: ask for FI_SOURCE (TSNET_OFI_CHECK_SENDER).
 * bell: endpoints without a wait fd get doorbells (TSNET_OFI_BELL).
 */
export function openOfi(binding: OfiBinding, cudaApi = false, dmabuf = true, source = true, bell = true): OfiOpened {
  try {
    OPENED ??= binding.ofiOpen({ hmem: true, cudaApi, dmabuf, source, bell });
    return OPENED;
  } catch (e) {
    const err = e as Error & { result?: number };
    throw err.result === ResultCode.SYSTEM_ERROR || err.result === undefined
      ? systemError(`TSNET_TRANSPORT=ofi: ${err.message}`)
      : invalidArgument(`TSNET_TRANSPORT=ofi: ${err.message}`);
  }
}

/** INFO: whether GPU memory may come as a DMA-BUF (NCCL's regMrDmaBuf), and if not, why. */
export function dmabufLine(nics: OfiNicInfo[], asked: boolean): string {
  if (!asked) return 'ofi: no DMA-BUF registration of GPU memory (OFI_NCCL_DISABLE_DMABUF=1)';
  const no = nics.find((n) => !n.dmabuf);
  if (!no) return 'ofi: GPU memory may be registered through DMA-BUF (FI_MR_DMABUF): NCCL passes DMA-BUF descriptors where it uses them';
  return `ofi: no DMA-BUF registration of GPU memory: ${no.dmabufWhy || `${no.provider} ${no.domain} does not offer it`}`;
}

/** Where a protocol thread's endpoints of one device run (INFO when it opens them). */
export function railsLine(rails: { thread: number }[], nics: number): string {
  const on = rails.map((r) => r.thread).join(', ');
  return `${rails.length} rail(s) on ${nics} NIC(s), endpoints on I/O thread(s) ${on}`;
}

// Devices from NICs: TSNET_DEVICE_GROUPS joins NICs by domain name (a+b,c), else one each.
function groups(nics: OfiNicInfo[], spec: string | undefined): number[][] {
  if (!spec) return nics.map((_n, i) => [i]);
  const byName = new Map(nics.map((n, i) => [n.domain, i]));
  const used = new Set<number>();
  const out: number[][] = [];
  for (const g of spec.split(',').map((x) => x.trim()).filter(Boolean)) {
    const members = g.split('+').map((m) => {
      const i = byName.get(m.trim());
      if (i === undefined) throw invalidArgument(`TSNET_DEVICE_GROUPS=${spec}: ${m} is not a NIC of the provider (${[...byName.keys()].join(', ')})`);
      if (used.has(i)) throw invalidArgument(`TSNET_DEVICE_GROUPS=${spec}: ${m} is in two groups`);
      used.add(i);
      return i;
    });
    if (members.length > 4) throw invalidArgument(`TSNET_DEVICE_GROUPS=${spec}: at most 4 NICs per device`);
    out.push(members);
  }
  nics.forEach((_n, i) => used.has(i) || out.push([i]));
  return out;
}
