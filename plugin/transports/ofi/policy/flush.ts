// Flush choice: whether an iflush does work, and which. A NIC's RDMA writes into GPU memory may
// still be on their way through PCIe when their completions are reported; a flush orders them
// before the GPU reads the buffer. 'read' reads one cache line of the received buffer through
// each rail (a read is ordered after that NIC's earlier writes); 'write-read' first writes a
// line of device memory and then reads that same line back (AMD GPUs need the write).
// See docs/flush.md.

export type FlushMethod = 'read' | 'write-read' | 'none';

export interface FlushMode {
  method: FlushMethod;
  /** Flush every non-empty receive, host memory included (TSNET_FLUSH=read|write-read); else GPU memory only. */
  all: boolean;
}

export const enum FlushAction {
  NONE = 0,
  READ = 1,
  WRITE_READ = 2,
}

/** TSNET_FLUSH=auto: GPU receives are flushed by a read, or by write-then-read, unless disabled. */
export function autoFlush(gdrFlushDisable: boolean, flushRdmaWrite: boolean): FlushMode {
  if (gdrFlushDisable) return { method: 'none', all: false };
  return { method: flushRdmaWrite ? 'write-read' : 'read', all: false };
}

/** What an iflush of a buffer of this kind and size must do. Empty buffers need nothing. */
export function flushAction(mode: FlushMode, kind: 'host' | 'cuda', size: number): FlushAction {
  if (size === 0 || mode.method === 'none') return FlushAction.NONE;
  if (kind === 'host' && !mode.all) return FlushAction.NONE;
  return mode.method === 'read' ? FlushAction.READ : FlushAction.WRITE_READ;
}

/** Bytes a flush read covers: one cache line, or less of a smaller buffer. */
export const FLUSH_LINE = 64;
export const flushBytes = (size: number): number => (size < FLUSH_LINE ? size : FLUSH_LINE);
