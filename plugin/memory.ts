// Registered regions: NCCL's memory as an address range plus an external view of it (no
// copy). An operation names its buffer as (region, offset, size); the native core has checked
// the range already. Transports submit addresses; eager copies use the view.
import { internalError } from './errors';

export interface Region {
  readonly id: number;
  readonly comm: number;
  /** Address of the first byte (a JS number: exact below 2^53). */
  readonly base: number;
  readonly size: number;
  /** The whole region, for copies; null for GPU memory (never touched from JavaScript). */
  readonly bytes: Uint8Array | null;
  readonly kind: 'host' | 'cuda';
  /** The transport's registrations of it (libfabric: one per rail), on device dev. */
  regs: unknown[];
  /** libfabric with TSNET_OFI_GPU_IPC: plain registrations for operations with this process itself. */
  localRegs?: unknown[];
  dev: number;
  /**
   * regMrDmaBuf: the region is the DMA-BUF fd's bytes from offset. The fd is NCCL's, valid only
   * during the registration call (NCCL closes it after): transports register through it then,
   * and never keep it.
   */
  dmabuf?: DmaBuf;
}

/** A DMA-BUF file descriptor and the region's offset within it (regMrDmaBuf). */
export interface DmaBuf {
  fd: number;
  offset: number;
}

export class Regions {
  private readonly byId = new Map<number, Region>();
  /** Sorted by base, for address lookups (loopback and tests). */
  private sorted: Region[] = [];

  /** A region of host memory (buffer: a view of it) or, with buffer null, of GPU memory. */
  add(id: number, comm: number, buffer: ArrayBuffer | null, base: number, size = buffer?.byteLength ?? 0): Region {
    const r: Region = { id, comm, base, size, bytes: buffer ? new Uint8Array(buffer) : null, kind: buffer ? 'host' : 'cuda', regs: [], dev: 0 };
    this.byId.set(id, r);
    // After every region of the same base: the order a stable sort would give. NCCL registers
    // thousands of regions per protocol thread (9604 a rank under PyTorch, item 44 of
    // docs/performance.md): a sort per call took 1.06-1.28 s for 10,000 regions in all, this
    // insertion 9.5 ms (item 45).
    this.sorted.splice(this.above(base), 0, r);
    return r;
  }

  /** The index of the first region whose base is above base. */
  private above(base: number): number {
    let lo = 0;
    let hi = this.sorted.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.sorted[mid].base <= base) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  get(id: number): Region {
    const r = this.byId.get(id);
    if (!r) throw internalError(`no registered region ${id}`);
    return r;
  }

  delete(id: number): Region | undefined {
    const r = this.byId.get(id);
    this.byId.delete(id);
    if (r) {
      let i = this.above(r.base) - 1;
      while (i >= 0 && this.sorted[i] !== r && this.sorted[i].base === r.base) i--;
      if (i >= 0 && this.sorted[i] === r) this.sorted.splice(i, 1);
    }
    return r;
  }

  /**
   * A region holding all of [addr, addr+len), or undefined. Regions may overlap (the same
   * buffer registered whole and in part, or by two comms): of those that start at or below
   * addr, the one with the highest base that holds the whole range.
   */
  find(addr: number, len: number): Region | undefined {
    for (let i = this.above(addr) - 1; i >= 0; i--) {
      const r = this.sorted[i];
      if (addr < r.base + Math.max(r.size, 1) && addr + len <= r.base + r.size) return r;
    }
    return undefined;
  }

  /** The bytes [addr, addr+len) of a registered region (throws when none holds them). */
  view(addr: number, len: number): Uint8Array {
    const r = this.find(addr, len);
    if (!r || !r.bytes) throw internalError(`no registered host region holds ${len} bytes at 0x${addr.toString(16)}`);
    return r.bytes.subarray(addr - r.base, addr - r.base + len);
  }
}
