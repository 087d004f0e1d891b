// A fake libfabric: Rails over JS memory with a seeded random scheduler. Posted operations
// execute in any order (no FI_ORDER_* is promised: not among sends, not among writes, not
// between sends and writes of one endpoint pair; the protocol relies on none), completions
// are queued per rail and delivered in batches of random size, one rail at a time, in the
// order the rail's CQ received them. What libfabric does promise is kept: a message or a
// write's data is in memory before its completion is reported to the target (unless
// `lagWrites`, which models GPU memory behind PCIe: the completion may come before the data
// is visible, until a read through that NIC), a send without a posted receive waits for one
// (RDM flow control), and a failed operation completes with an error entry and the
// provider's words. A write from a CUDA IPC registration (FI_HMEM_DEVICE_ONLY) behaves as
// libfabric's shm with CUDA does: both completions come before the target's device-to-device
// copy has run, and the copy reads the source as it is when it runs, which is at the target
// host's next local read (cudaMemcpy between device buffers returns before the copy ends;
// the process's next copy out of device memory waits for it).
//
// Memory: addresses are numbers mapped to Uint8Arrays, with unmapped gaps between
// allocations. Keys are checked: a wrong key, a key of another NIC or an access outside the
// registration gives an error completion (-EACCES). Faults: a killed host's operations vanish
// and operations that target it fail with -ECONNRESET; failNext() fails a chosen operation.
import { ADDR_SPLIT } from '../../plugin/addr';
import { systemError } from '../../plugin/errors';
import {
  type Completion,
  CqFlag,
  type HostBuffer,
  type OnCompletions,
  type Rail,
  type Region,
  type Registration,
} from '../../plugin/transports/ofi/fabric';

import { prng as rng } from '../support/data';

export { rng };

export interface FakeOptions {
  seed?: number;
  /** FI_RX_CQ_DATA: remote writes with immediate data consume a posted receive. */
  rxCqData?: boolean;
  /** FI_MR_VIRT_ADDR (remote addresses are virtual addresses); else offsets into the registration. */
  virtAddr?: boolean;
  /** false: remote writes complete with length 0, as on tcp;ofi_rxm (default true). */
  remoteLen?: boolean;
  cqDataBytes?: number;
  maxMsgSize?: number;
  /**
   * Remote writes into GPU memory (and host memory marked with lagging()) become visible after
   * their completion: some random time later (true), or only when a read passes through that
   * NIC ('until-read'). Host memory is coherent when the completion is reported.
   */
  lagWrites?: boolean | 'until-read';
  /** Largest batch of completions delivered at once. */
  maxBatch?: number;
  /**
   * false: a send that gathers host and GPU memory throws, as libfabric 1.17's shm crashes
   * on it (it copies every iovec as the first one's memory). Default true.
   */
  mixedIov?: boolean;
  /** TSNET_TRACE: completions carry a time (the step count + 1, in µs) and the rail's index as their I/O thread. */
  times?: boolean;
  /**
   * FI_SOURCE: the completion of a message or remote write names its sender, as the sender's
   * index in the target rail's address vector, or -1 when not in it (default true).
   */
  source?: boolean;
  /** With source: remote writes name their sender too (default true; false as rxm). */
  sourceWrites?: boolean;
  /**
   * With source, as shm of libfabric 1.17: a sender not in the address vector is named 0
   * (not -1), and so, for good, is about a third of the known senders (shm's map entry for a
   * peer whose first message came before its address was inserted keeps no AV id).
   */
  shmSource?: boolean;
}

interface Mapping {
  addr: number;
  bytes: Uint8Array;
}

export class FakeMemory {
  private maps: Mapping[] = [];
  private next = 0x1000_0000;

  alloc(size: number): Mapping {
    const addr = this.next;
    this.next += Math.ceil(Math.max(size, 1) / 4096) * 4096 + 4096; // a guard page after each
    const m = { addr, bytes: new Uint8Array(Math.max(size, 1)) };
    this.maps.push(m);
    return m;
  }

  release(addr: number): void {
    this.maps = this.maps.filter((m) => m.addr !== addr);
  }

  /** The bytes [addr, addr+len), or null when they are not mapped. */
  view(addr: number, len: number): Uint8Array | null {
    let lo = 0;
    let hi = this.maps.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const m = this.maps[mid];
      if (addr < m.addr) hi = mid - 1;
      else if (addr >= m.addr + m.bytes.length) lo = mid + 1;
      else {
        const off = addr - m.addr;
        if (off + len > m.bytes.length) return null;
        return m.bytes.subarray(off, off + len);
      }
    }
    return len === 0 ? new Uint8Array(0) : null;
  }
}

interface Reg extends Registration {
  id: number;
  rail: FakeRail;
  kind: 'host' | 'cuda';
  /** FI_HMEM_DEVICE_ONLY: shm moves it by CUDA IPC, which fails when the peer is this host itself. */
  ipc: boolean;
  /** The GPU of CUDA memory; -1 for host memory. */
  device: number;
  base: number;
  len: number;
}

interface Posted {
  buf: HostBuffer;
  offset: number;
  len: number;
  token: number;
}

type OpType = 'send' | 'write' | 'read';

interface Op {
  type: OpType;
  src: FakeRail;
  peer: number;
  iov: [number, number, number][]; // addr, len, desc
  raddr: number;
  keyLo: number;
  keyHi: number;
  imm: number;
  immHi?: number;
  token: number;
  /** A failure failNext() chose for it. */
  injected?: Injected;
  /** A read: the CUDA IPC copies into its host that were pending when it was posted. */
  ipcBefore?: Set<Landing>;
}

interface Landing {
  rail: FakeRail;
  dst: Uint8Array;
  data: Uint8Array;
  /** CUDA IPC copies: the target's GPU. */
  device?: number;
}

export interface Injected {
  type?: OpType;
  status: number;
  error: string;
}

export class FakeHost {
  dead = false;
  readonly rails: FakeRail[] = [];
  constructor(readonly name: string) {}
}

export class FakeRail implements Rail {
  readonly name: Uint8Array;
  readonly injectSize = 64;
  readonly maxMsgSize: number;
  readonly cqDataBytes: number;
  readonly rxCqData: boolean;
  readonly source: boolean;
  readonly sourceWrites: boolean;
  readonly av: string[] = [];
  readonly posted: Posted[] = [];
  readonly cq: Completion[] = [];
  readonly regs = new Map<number, Reg>();
  readonly byKey = new Map<bigint, Reg>();
  readonly lagging: Landing[] = [];
  /** CUDA IPC writes into this NIC's host whose copy has not run: data is a live view of the source. */
  readonly ipcPending: Landing[] = [];
  onCompletions: OnCompletions | undefined;
  inject: Injected[] = [];
  /** Operations posted on this rail (for tests that look at what was issued). */
  readonly log: { type: OpType; len: number; imm: number; token: number; raddr: number }[] = [];
  private nextKey = 1;

  constructor(
    readonly fabric: FakeFabric,
    readonly host: FakeHost,
    readonly index: number,
    readonly uid: number,
  ) {
    this.name = new Uint8Array(16);
    new DataView(this.name.buffer).setUint32(0, 0x454b4146, true); // 'FAKE'
    new DataView(this.name.buffer).setUint32(4, uid, true);
    this.maxMsgSize = fabric.opts.maxMsgSize ?? 1 << 30;
    this.cqDataBytes = fabric.opts.cqDataBytes ?? 8;
    this.rxCqData = fabric.opts.rxCqData ?? false;
    this.source = fabric.opts.source ?? true;
    this.sourceWrites = this.source && (fabric.opts.sourceWrites ?? true);
  }

  /**
   * FI_SOURCE: how this rail's address vector names the sender rail (-1: not in it); undefined
   * without source. A remote write without sourceWrites gets 0, as rxm leaves the entry's source.
   */
  srcOf(sender: FakeRail, write = false): number | undefined {
    if (!this.source) return undefined;
    if (write && !this.sourceWrites) return 0;
    const id = this.av.indexOf(Buffer.from(sender.name).toString('hex'));
    if (!this.fabric.opts.shmSource) return id;
    let unnamed = this.unnamed.get(sender.uid);
    if (unnamed === undefined) this.unnamed.set(sender.uid, (unnamed = this.fabric.random() < 1 / 3));
    return id < 0 || unnamed ? 0 : id;
  }

  /** shmSource: senders this rail names 0 for good. */
  private readonly unnamed = new Map<number, boolean>();

  insertPeer(name: Uint8Array): number {
    return this.av.push(Buffer.from(name).toString('hex')) - 1;
  }

  regMr(addr: number, len: number, kind: 'host' | 'cuda', ipc = false, device = 0): Registration {
    if (!this.fabric.memory.view(addr, len)) throw systemError(`fi_mr_reg: [0x${addr.toString(16)}, +${len}) is not mapped (fake: Invalid argument)`);
    const key = (BigInt(this.uid) << 40n) | BigInt(this.nextKey++ * 7919);
    const id = this.fabric.nextDesc++;
    const virt = this.fabric.opts.virtAddr ?? true;
    const reg: Reg = {
      id,
      rail: this,
      kind,
      ipc: ipc && kind === 'cuda',
      device: kind === 'cuda' ? device : -1,
      base: addr,
      len,
      desc: id,
      key,
      keyLo: Number(key & 0xffff_ffffn),
      keyHi: Number(key >> 32n),
      remoteDelta: virt ? 0 : -addr,
    };
    this.regs.set(id, reg);
    this.byKey.set(key, reg);
    return reg;
  }

  deregMr(reg: Registration): void {
    const r = reg as Reg;
    this.regs.delete(r.id);
    this.byKey.delete(r.key);
  }

  alloc(bytes: number): HostBuffer {
    const m = this.fabric.memory.alloc(bytes);
    return { addr: m.addr, bytes: m.bytes.subarray(0, bytes), reg: this.regMr(m.addr, bytes, 'host') };
  }

  free(buf: HostBuffer): void {
    this.deregMr(buf.reg);
    this.fabric.memory.release(buf.addr);
  }

  postRecv(buf: HostBuffer, offset: number, len: number, token: number): void {
    if (this.host.dead) return;
    this.posted.push({ buf, offset, len, token });
  }

  send(peer: number, hi: number, lo: number, len: number, desc: number, imm: number, token: number): void {
    const addr = hi * ADDR_SPLIT + lo;
    this.post({ type: 'send', src: this, peer, iov: [[addr, len, desc]], raddr: 0, keyLo: 0, keyHi: 0, imm, token });
  }

  send2(peer: number, hi0: number, lo0: number, l0: number, d0: number, hi1: number, lo1: number, l1: number, d1: number, imm: number, token: number): void {
    const a0 = hi0 * ADDR_SPLIT + lo0;
    const a1 = hi1 * ADDR_SPLIT + lo1;
    if (this.fabric.opts.mixedIov === false && l0 > 0 && l1 > 0 && this.regs.get(d0)?.kind !== this.regs.get(d1)?.kind)
      throw new Error('fake: fi_sendmsg gathers host and GPU memory, which this libfabric cannot (SIGSEGV in the provider)');
    this.post({ type: 'send', src: this, peer, iov: [[a0, l0, d0], [a1, l1, d1]], raddr: 0, keyLo: 0, keyHi: 0, imm, token });
  }

  write(peer: number, hi: number, lo: number, len: number, desc: number, rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, token: number, immHi = 0): void {
    const addr = hi * ADDR_SPLIT + lo;
    const raddr = rhi * ADDR_SPLIT + rlo;
    this.post({ type: 'write', src: this, peer, iov: [[addr, len, desc]], raddr, keyLo, keyHi, imm, immHi, token });
  }

  read(peer: number, hi: number, lo: number, len: number, desc: number, rhi: number, rlo: number, keyLo: number, keyHi: number, token: number): void {
    const addr = hi * ADDR_SPLIT + lo;
    const raddr = rhi * ADDR_SPLIT + rlo;
    this.post({ type: 'read', src: this, peer, iov: [[addr, len, desc]], raddr, keyLo, keyHi, imm: -1, token });
  }

  private post(op: Op): void {
    if (this.host.dead) return;
    this.log.push({ type: op.type, len: op.iov.reduce((s, v) => s + v[1], 0), imm: op.imm, token: op.token, raddr: op.raddr });
    if (op.type === 'read') op.ipcBefore = new Set(this.host.rails.flatMap((r) => r.ipcPending));
    const i = this.inject.findIndex((x) => !x.type || x.type === op.type);
    this.fabric.ops.push(i >= 0 ? { ...op, injected: this.inject.splice(i, 1)[0] } : op);
  }

  /** Fails the next operation (of a type) posted on this rail with status and the provider's words. */
  failNext(x: Injected): void {
    this.inject.push(x);
  }

  /** Makes every lagging remote write into this NIC's memory visible. */
  land(): void {
    for (const l of this.lagging.splice(0)) l.dst.set(l.data);
  }

  /**
   * Runs the pending CUDA IPC copies into this NIC that are in `before` and on GPU device, from
   * their sources as they are now: a local read orders the copies issued on its GPU before it
   * was posted, and no others.
   */
  landIpc(before: Set<Landing>, device: number): void {
    const keep: Landing[] = [];
    for (const l of this.ipcPending)
      if (before.has(l) && l.device === device) l.dst.set(l.data);
      else keep.push(l);
    this.ipcPending.length = 0;
    this.ipcPending.push(...keep);
  }
}

export class FakeFabric {
  readonly memory = new FakeMemory();
  readonly random: () => number;
  readonly ops: Op[] = [];
  readonly rails: FakeRail[] = [];
  readonly hosts: FakeHost[] = [];
  nextDesc = 1;
  steps = 0;
  /** Writes executed from a CUDA IPC registration. */
  ipcWrites = 0;
  /** Operations for which this says true wait (a test's way to force an order). */
  hold: ((type: OpType, len: number, imm: number) => boolean) | undefined;
  private readonly byName = new Map<string, FakeRail>();
  private readonly laggy = new Set<number>();

  constructor(readonly opts: FakeOptions = {}) {
    this.random = rng(opts.seed ?? 1);
  }

  /** A process with nics NICs (one rail each). */
  host(name: string, nics: number): FakeHost {
    const h = new FakeHost(name);
    for (let i = 0; i < nics; i++) {
      const r = new FakeRail(this, h, i, this.rails.length + 1);
      this.rails.push(r);
      h.rails.push(r);
      this.byName.set(Buffer.from(r.name).toString('hex'), r);
    }
    this.hosts.push(h);
    return h;
  }

  /** The host dies: its operations vanish, its posted receives are gone, its peers' operations to it fail. */
  kill(h: FakeHost): void {
    h.dead = true;
    for (const r of h.rails) {
      r.posted.length = 0;
      r.cq.length = 0;
      r.lagging.length = 0;
      r.ipcPending.length = 0;
    }
    for (let i = this.ops.length - 1; i >= 0; i--) if (this.ops[i].src.host === h) this.ops.splice(i, 1);
  }

  /**
   * Registered memory for a test: a Region over every rail of host h. ipc: GPU memory
   * registered for CUDA IPC, with plain localRegs, as the transport does under TSNET_OFI_GPU_IPC.
   */
  region(h: FakeHost, size: number, kind: 'host' | 'cuda' = 'host', id = 1, ipc = false, device = 0): Region {
    const m = this.memory.alloc(size);
    const regs = h.rails.map((r) => r.regMr(m.addr, size, kind, ipc, device));
    const localRegs = ipc && kind === 'cuda' ? h.rails.map((r) => r.regMr(m.addr, size, kind, false, device)) : undefined;
    return { id, base: m.addr, size, bytes: kind === 'host' ? m.bytes.subarray(0, size) : null, kind, regs, localRegs };
  }

  /** Remote writes into this host region lag like writes into GPU memory (a CPU test of flush). */
  lagging(r: Region): void {
    this.laggy.add(r.base);
  }

  /** The memory behind a region, whatever its kind. */
  bytesOf(r: Region): Uint8Array {
    return this.memory.view(r.base, r.size)!;
  }

  /** Runs one random step: executes an operation, delivers a batch of completions, or lands a lagging write. False when nothing can progress. */
  step(): boolean {
    const cqs = this.rails.filter((r) => r.cq.length > 0 && !r.host.dead);
    const lag = this.opts.lagWrites === true ? this.rails.filter((r) => r.lagging.length > 0) : [];
    const n = this.ops.length + cqs.length + lag.length;
    if (n === 0) return false;
    // Try a few random picks; an operation may be blocked (no posted receive at its target).
    for (let tries = 0; tries < 2 * n + 4; tries++) {
      const k = Math.floor(this.random() * n);
      if (k < this.ops.length) {
        if (this.execute(k)) return this.stepped();
      } else if (k < this.ops.length + cqs.length) {
        this.deliver(cqs[k - this.ops.length]);
        return this.stepped();
      } else {
        const r = lag[k - this.ops.length - cqs.length];
        const l = r.lagging.shift()!; // a NIC's posted writes land in order
        l.dst.set(l.data);
        return this.stepped();
      }
    }
    // Every pick was blocked: try each operation once in order.
    for (let k = 0; k < this.ops.length; k++) if (this.execute(k)) return this.stepped();
    if (cqs.length) {
      this.deliver(cqs[0]);
      return this.stepped();
    }
    return false;
  }

  private stepped(): true {
    this.steps++;
    return true;
  }

  /** Steps until until() holds (true) or nothing progresses / maxSteps pass (false). after() runs after every step. */
  run(until: () => boolean = () => false, maxSteps = 1_000_000, after?: () => void): boolean {
    for (let i = 0; i < maxSteps; i++) {
      if (until()) return true;
      if (!this.step()) return until();
      after?.();
    }
    return until();
  }

  private deliver(r: FakeRail): void {
    const max = this.opts.maxBatch ?? 8;
    const n = 1 + Math.floor(this.random() * Math.min(max, r.cq.length));
    const batch = r.cq.splice(0, n);
    if (this.opts.times)
      for (const c of batch) {
        c.time = this.steps + 1;
        c.io = r.index;
      }
    r.onCompletions?.(r, batch);
  }

  private fail(op: Op, status: number, error: string): void {
    op.src.cq.push({ token: op.token, status, flags: 0, len: 0, imm: 0, error });
  }

  private local(op: Op): Uint8Array[] | string {
    const out: Uint8Array[] = [];
    for (const [addr, len, desc] of op.iov) {
      if (len === 0) {
        out.push(new Uint8Array(0));
        continue;
      }
      const reg = op.src.regs.get(desc);
      if (!reg) return `fi_${op.type}: local descriptor ${desc} is not a registration of this domain (Invalid argument)`;
      if (addr < reg.base || addr + len > reg.base + reg.len) return `fi_${op.type}: [0x${addr.toString(16)}, +${len}) is outside its registration (Invalid argument)`;
      out.push(this.memory.view(addr, len)!);
    }
    return out;
  }

  private remote(op: Op, dst: FakeRail, len: number): { bytes: Uint8Array; lag: boolean; cuda: boolean; device: number } | string {
    const key = (BigInt(op.keyHi >>> 0) << 32n) | BigInt(op.keyLo >>> 0);
    const reg = dst.byKey.get(key);
    if (!reg) return `Remote access error: key 0x${key.toString(16)} is not registered at the target (Permission denied)`;
    const addr = (this.opts.virtAddr ?? true) ? op.raddr : reg.base + op.raddr;
    if (addr < reg.base || addr + len > reg.base + reg.len)
      return `Remote access error: [0x${addr.toString(16)}, +${len}) is outside key 0x${key.toString(16)}'s registration (Permission denied)`;
    return { bytes: this.memory.view(addr, len)!, lag: reg.kind === 'cuda' || this.laggy.has(reg.base), cuda: reg.kind === 'cuda', device: reg.device };
  }

  // Executes ops[k]; false when it must wait (no posted receive at its target).
  private execute(k: number): boolean {
    const op = this.ops[k];
    if (this.hold?.(op.type, op.iov.reduce((s, v) => s + v[1], 0), op.imm)) return false;
    if (op.injected) {
      this.ops.splice(k, 1);
      this.fail(op, op.injected.status, op.injected.error);
      return true;
    }
    const dst = this.byName.get(op.src.av[op.peer] ?? '');
    if (!dst) {
      this.ops.splice(k, 1);
      this.fail(op, -22, `fi_${op.type}: peer ${op.peer} is not in the address vector (Invalid argument)`);
      return true;
    }
    if (dst.host === op.src.host && op.iov.some((v) => op.src.regs.get(v[2])?.ipc)) {
      this.ops.splice(k, 1);
      this.fail(op, -22, `fi_${op.type}: a CUDA IPC registration used with this process itself (fake shm: cudaIpcOpenMemHandle: invalid context)`);
      return true;
    }
    if (dst.host.dead) {
      this.ops.splice(k, 1);
      this.fail(op, -104, `fi_${op.type}: connection to ${dst.host.name} reset by peer (fake tcp;ofi_rxm: Connection reset by peer)`);
      return true;
    }
    const src = this.local(op);
    if (typeof src === 'string') {
      this.ops.splice(k, 1);
      this.fail(op, -22, src);
      return true;
    }
    const len = src.reduce((s, b) => s + b.length, 0);
    const mask = op.src.cqDataBytes >= 4 ? 0xffff_ffff : 2 ** (8 * op.src.cqDataBytes) - 1;
    if (op.type === 'send') {
      if (dst.posted.length === 0) return false;
      this.ops.splice(k, 1);
      const rx = dst.posted.shift()!;
      if (len > rx.len) {
        dst.cq.push({ token: rx.token, status: -265, flags: CqFlag.RECV, len: 0, imm: 0, error: `message of ${len} bytes truncated to ${rx.len} (Message truncated)` });
        op.src.cq.push({ token: op.token, status: 0, flags: CqFlag.SEND, len, imm: 0 });
        return true;
      }
      let at = rx.offset;
      for (const b of src) {
        rx.buf.bytes.set(b, at);
        at += b.length;
      }
      const hasImm = op.imm >= 0;
      dst.cq.push({ token: rx.token, status: 0, flags: CqFlag.RECV | (hasImm ? CqFlag.REMOTE_CQ_DATA : 0), len, imm: hasImm ? (op.imm & mask) >>> 0 : 0, src: dst.srcOf(op.src) });
      op.src.cq.push({ token: op.token, status: 0, flags: CqFlag.SEND, len, imm: 0 });
      return true;
    }
    const target = this.remote(op, dst, len);
    if (typeof target === 'string') {
      this.ops.splice(k, 1);
      this.fail(op, -13, target);
      return true;
    }
    if (op.type === 'read') {
      this.ops.splice(k, 1);
      dst.land(); // a read through a NIC is ordered after the writes that NIC delivered
      // and a local read of GPU memory after the IPC copies issued on its GPU before it was posted
      if (dst.host === op.src.host && target.cuda) for (const r of dst.host.rails) r.landIpc(op.ipcBefore!, target.device);
      src[0].set(target.bytes);
      op.src.cq.push({ token: op.token, status: 0, flags: CqFlag.READ, len, imm: 0 });
      return true;
    }
    // write
    const hasImm = op.imm >= 0;
    let rxToken = 0;
    if (hasImm && dst.rxCqData) {
      if (dst.posted.length === 0) return false;
      rxToken = dst.posted.shift()!.token;
    }
    this.ops.splice(k, 1);
    const ipc = len > 0 && op.src.regs.get(op.iov[0][2])?.ipc === true;
    if (ipc) this.ipcWrites++;
    // Device to host (a registration of host memory at the target) is a synchronous copy.
    if (ipc && target.cuda) dst.ipcPending.push({ rail: dst, dst: target.bytes, data: src[0], device: target.device });
    else if (this.opts.lagWrites && target.lag && len > 0) dst.lagging.push({ rail: dst, dst: target.bytes, data: src[0].slice() });
    else target.bytes.set(src[0]);
    if (hasImm)
      dst.cq.push({
        token: rxToken,
        status: 0,
        flags: CqFlag.REMOTE_WRITE | CqFlag.REMOTE_CQ_DATA,
        // tcp;ofi_rxm reports no length for a remote write: the protocol then reads the high half.
        len: this.opts.remoteLen === false ? 0 : len,
        imm: (op.imm & mask) >>> 0,
        immHi: op.src.cqDataBytes >= 8 ? (op.immHi ?? 0) : 0,
        src: dst.srcOf(op.src, true),
      });
    op.src.cq.push({ token: op.token, status: 0, flags: CqFlag.WRITE, len, imm: 0 });
    return true;
  }
}
