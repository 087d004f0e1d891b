// A Rail (fabric.ts) over the native engine: an RDM endpoint owned by an I/O thread
// (native/engine/engine_ofi.cc). Operations go into this protocol thread's submission ring to
// that I/O thread (TSN_SUB_OFI_*); their completions come back through the port, one at a time,
// and are handed to the endpoint as batches of one (reused objects: nothing is allocated per
// completion). Registrations are numbered natively; a registration's number is its desc.
import { hiOf, loOf } from '../../addr';
import { type CqeHandler, type EngineBinding, type Port } from '../../engine/port';
import { OP_REMOTE, SubKind } from '../../engine/records';
import { NetError } from '../../errors';
import { monoMs } from '../../clock';
import { log } from '../../log';
import type { DmaBuf } from '../../memory';
import type { Completion, HostBuffer, OnCompletions, Rail, Registration } from './fabric';

/** A registration as the engine answers it. */
export interface MrAnswer {
  mr: number;
  keyLo: number;
  keyHi: number;
  key: bigint;
  /** The remote address of the region's first byte (its address, or 0 where remote addresses are offsets). */
  remoteBase: number;
  /** ipc asked: whether the region got FI_HMEM_DEVICE_ONLY, and if not, why. */
  ipc?: boolean;
  ipcWhy?: string;
  /** The GPU ordinal of CUDA memory; -1 for host memory. */
  device?: number;
  /** Registered through a DMA-BUF (FI_MR_DMABUF). */
  dmabuf?: boolean;
}

/** A NIC as ofiOpen describes it. */
export interface OfiNicInfo {
  provider: string;
  domain: string;
  fabric: string;
  pciPath: string;
  guid: bigint;
  speedMbps: number;
  hmem: boolean;
  hmemWhy: string;
  /** hmem, and libfabric makes no CUDA call (endpoints take FI_OPT_CUDA_API_PERMITTED = false). */
  noCudaApi: boolean;
  /** hmem, and GPU memory may be registered through a DMA-BUF (asked with ofiOpen's dmabuf). */
  dmabuf?: boolean;
  /** Why not, when asked for and hmem granted. */
  dmabufWhy?: string;
  /** One send may gather host and GPU memory (libfabric 1.18 and newer). */
  mixedIov: boolean;
  virtAddr: boolean;
  mrLocal: boolean;
  rxCqData: boolean;
  /** FI_SOURCE granted: completions of messages name their sender. */
  source: boolean;
  /** source, and completions of remote writes name theirs too (shm; rxm names none). */
  sourceWrites: boolean;
  autoProgress: boolean;
  maxMsgSize: number;
  injectSize: number;
  cqDataBytes: number;
  describe: string;
}

/** The engine's libfabric functions (native/engine/engine_ofi.cc). */
export interface OfiBinding extends EngineBinding {
  ofiOpen(opts: { provider?: string; hmem: boolean; cudaApi?: boolean; dmabuf?: boolean; source?: boolean; bell?: boolean }): { version: string; progress: string; nics: OfiNicInfo[] };
  /** skipped: region names shm refused as in use by this pid (left by a killed process with the same pid), passed by. */
  /**
   * group: the rails of one endpoint share their I/O threads' busy-poll window; 0 or absent
   * starts a new group, the answer's (native/engine/engine.cc, g_groupWork).
   */
  ofiRail(nic: number, thread: number, link: number, group?: number): { lane: number; thread: number; group?: number; name: Uint8Array; skipped?: number };
  ofiInsertPeer(lane: number, name: Uint8Array): number;
  /** fd (with offset): register through that DMA-BUF (FI_MR_DMABUF, libfabric API 1.20); the fd is not kept. */
  ofiRegMr(lane: number, addr: number, len: number, cuda: boolean, ipc?: boolean, fd?: number, offset?: number): MrAnswer;
  /** Deregisters once no operation in flight names mr, waiting up to waitMs; returns how many are still in flight (0: deregistered). */
  ofiDeregMr(mr: number, waitMs?: number): number | void;
  ofiAlloc(lane: number, bytes: number): MrAnswer & { addr: number; buffer: ArrayBuffer };
  ofiLastError(lane: number): string;
  /** I/O threads inside one provider call for thresholdMs or more, each reported once (engine_js.cc). */
  ioStalls?(thresholdMs: number): { thread: number; lane: number; ms: number; call: string }[];
  /** Every thread's stack into the file (native/stacks.h; %p: the pid). */
  dumpStacks?(pathTemplate: string): { threads: number; answered: number; file: string };
  ioClose(lane: number, graceful: boolean): { partial: boolean; hard: boolean };
  /** Waits up to ms for the I/O threads to close the endpoints whose close gave up on them; returns how many are still open. */
  ofiAwaitAbandoned?(ms: number): number;
}

/** INFO when shm refused region names of this pid that a killed process with the same pid had used. */
export function shmSkippedLine(skipped: number, pid: number): string {
  return (
    `ofi: shm refused ${skipped} region name(s) for this pid (${pid}): a region of that name in /dev/shm gave this pid as its ` +
    'owner, which is what a killed process with the same pid leaves behind (shm removes such a file when it refuses it); ' +
    'this endpoint took the next name'
  );
}

/** Native errors carry their NCCL result code. */
function netError(e: unknown): NetError {
  const err = e as Error & { result?: number };
  return new NetError(typeof err.result === 'number' ? err.result : 2, err.message);
}

/**
 * How long a deregistration waits for operations in flight on the registration. Only a failed
 * comm's operations can be (NCCL gives memory back once its requests are done, and a request in
 * flight on the memory ends its comm): they complete soon or never (shm drops a write whose
 * target registration is gone, and reports nothing), so the rest is asked again at every tick.
 */
export const DEREG_WAIT_MS = 5;

/** A deregistration that waits for operations in flight. */
interface PendingDereg {
  desc: number;
  since: number;
  warned: boolean;
}

function registration(a: MrAnswer, base: number): Registration {
  return { desc: a.mr, key: a.key, keyLo: a.keyLo, keyHi: a.keyHi, remoteDelta: a.remoteBase - base, ipc: a.ipc, ipcWhy: a.ipcWhy, device: a.device, dmabuf: a.dmabuf };
}

export class NativeRail implements Rail, CqeHandler {
  readonly name: Uint8Array;
  readonly injectSize: number;
  readonly maxMsgSize: number;
  readonly cqDataBytes: number;
  readonly rxCqData: boolean;
  readonly source: boolean;
  readonly sourceWrites: boolean;
  private readonly lane: number;
  /** The I/O thread that owns the endpoint. */
  readonly thread: number;
  /** The rails whose work keeps this rail's I/O thread in its busy-poll window: the rails of one endpoint. */
  readonly group: number;
  private readonly link: number;
  private readonly one: Completion = { token: 0, status: 0, flags: 0, len: 0, imm: 0, immHi: 0, src: -1 };
  private readonly batch: Completion[] = [this.one];
  private closed = false;
  private readonly pendingDeregs: PendingDereg[] = [];

  constructor(
    private readonly port: Port,
    private readonly binding: OfiBinding,
    nic: number,
    info: OfiNicInfo,
    readonly index: number,
    private readonly onCompletions: OnCompletions,
    /** The group of the endpoint's other rails; 0: a new one. */
    group = 0,
  ) {
    this.link = port.addLink(this);
    try {
      const r = binding.ofiRail(nic, -1, this.link, group);
      this.lane = r.lane;
      this.thread = r.thread;
      this.group = r.group ?? group;
      this.name = new Uint8Array(r.name);
      if (r.skipped) log.info(shmSkippedLine(r.skipped, process.pid));
    } catch (e) {
      port.removeLink(this.link);
      throw netError(e);
    }
    this.injectSize = info.injectSize;
    this.maxMsgSize = info.maxMsgSize;
    this.cqDataBytes = info.cqDataBytes;
    this.rxCqData = info.rxCqData;
    this.source = info.source === true;
    this.sourceWrites = this.source && info.sourceWrites === true;
  }

  insertPeer(name: Uint8Array): number {
    try {
      return this.binding.ofiInsertPeer(this.lane, name);
    } catch (e) {
      throw netError(e);
    }
  }

  regMr(addr: number, len: number, kind: 'host' | 'cuda', ipc = false, dmabuf?: DmaBuf): Registration {
    try {
      const cuda = kind === 'cuda';
      const answer = dmabuf
        ? this.binding.ofiRegMr(this.lane, addr, len, cuda, ipc && cuda, dmabuf.fd, dmabuf.offset)
        : this.binding.ofiRegMr(this.lane, addr, len, cuda, ipc && cuda);
      return registration(answer, addr);
    } catch (e) {
      throw netError(e);
    }
  }

  deregMr(reg: Registration): void {
    this.dereg(reg.desc);
  }

  alloc(bytes: number): HostBuffer {
    try {
      const a = this.binding.ofiAlloc(this.lane, bytes);
      return { addr: a.addr, bytes: new Uint8Array(a.buffer), reg: registration(a, a.addr) };
    } catch (e) {
      throw netError(e);
    }
  }

  /** The memory itself goes with the last view of it. */
  free(buf: HostBuffer): void {
    this.dereg(buf.reg.desc);
  }

  private dereg(desc: number): void {
    if ((this.binding.ofiDeregMr(desc, this.closed ? 0 : DEREG_WAIT_MS) ?? 0) > 0) this.pendingDeregs.push({ desc, since: monoMs(), warned: false });
  }

  /** Registrations whose deregistration waits for operations in flight on them. */
  get deregsPending(): number {
    return this.pendingDeregs.length;
  }

  /**
   * Asks again for the deregistrations that waited (the transport's tick, and close). Those that
   * waited timeoutMs get one WARN line per call that finds any, each registration once; they are
   * asked again until the endpoint closes, which ends every operation.
   */
  retryDeregs(now: number, timeoutMs: number, warn = true): void {
    const list = this.pendingDeregs;
    let keep = 0;
    let late = 0;
    let ops = 0;
    for (let i = 0; i < list.length; i++) {
      const p = list[i];
      const left = this.binding.ofiDeregMr(p.desc, 0) ?? 0;
      if (left <= 0) continue;
      if (warn && !p.warned && now - p.since >= timeoutMs) {
        p.warned = true;
        late++;
        ops += left;
      }
      list[keep++] = p;
    }
    list.length = keep;
    if (late)
      log.warn(
        `ofi: rail ${this.index}: ${late} deregistered registration(s) still have ${ops} operation(s) in flight after ${(timeoutMs / 1000).toFixed(1)} s ` +
          `(a failed comm's: the provider may never complete them, and holds a slot for each); they stay registered until the endpoint closes ` +
          `(${keep} waiting in all)`,
      );
  }

  postRecv(buf: HostBuffer, offset: number, len: number, token: number): void {
    const a = buf.addr + offset;
    this.port.submitOfiRecv(this.thread, this.lane, this.link, token, hiOf(a), loOf(a), len, buf.reg.desc);
  }

  send(peer: number, hi: number, lo: number, len: number, desc: number, imm: number, token: number): void {
    this.port.submitOfiNow(this.thread, this.lane, this.link, token, SubKind.OFI_SEND, hi, lo, len, desc, peer, 0, 0, 0, 0, imm);
  }

  // The first part travels in the fields a send does not use: raddr, keyLo (its length), keyHi (its desc).
  send2(peer: number, hi0: number, lo0: number, len0: number, desc0: number, hi1: number, lo1: number, len1: number, desc1: number, imm: number, token: number): void {
    this.port.submitOfiNow(this.thread, this.lane, this.link, token, SubKind.OFI_SEND, hi1, lo1, len1, desc1, peer, hi0, lo0, len0, desc0, imm);
  }

  // Sends, and writes with immediate data, this thread may post itself (Port.submitOfiNow: small
  // ones, as injects); a write without (a flush's) waits for its completion from the I/O thread.
  write(peer: number, hi: number, lo: number, len: number, desc: number, rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, token: number, immHi = 0): void {
    if (imm < 0) this.port.submitOfi(this.thread, this.lane, this.link, token, SubKind.OFI_WRITE, hi, lo, len, desc, peer, rhi, rlo, keyLo, keyHi, imm, immHi);
    else this.port.submitOfiNow(this.thread, this.lane, this.link, token, SubKind.OFI_WRITE, hi, lo, len, desc, peer, rhi, rlo, keyLo, keyHi, imm, immHi);
  }

  read(peer: number, hi: number, lo: number, len: number, desc: number, rhi: number, rlo: number, keyLo: number, keyHi: number, token: number): void {
    this.port.submitOfi(this.thread, this.lane, this.link, token, SubKind.OFI_READ, hi, lo, len, desc, peer, rhi, rlo, keyLo, keyHi, -1);
  }

  onOp(op: number, status: number, value: number, time: number, io: number, imm: number, flags: number, immHi: number, src: number): void {
    const c = this.one;
    c.src = src;
    c.time = time;
    c.io = io;
    c.immHi = immHi;
    c.token = op === OP_REMOTE ? 0 : op;
    c.status = status;
    c.flags = flags; // records.ts CqeFlag: the same bits as fabric.ts CqFlag
    c.len = value;
    c.imm = imm;
    c.error = status ? this.binding.ofiLastError(this.lane) : undefined;
    this.onCompletions(this, this.batch);
  }

  onRx(): void {}

  /** Closes the endpoint: its posted receives are cancelled, nothing of it completes afterwards. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.port.flush();
    this.binding.ioClose(this.lane, false);
    this.port.removeLink(this.link);
    // The endpoint is closed: the provider ended every operation it held.
    if (this.pendingDeregs.length) {
      this.retryDeregs(monoMs(), 0, false);
      if (this.pendingDeregs.length) log.warn(`ofi: ${this.pendingDeregs.length} registration(s) still have operations in flight after their endpoint closed (an I/O thread stuck inside the provider); they are kept`);
      this.pendingDeregs.length = 0;
    }
  }
}
