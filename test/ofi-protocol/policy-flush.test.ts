// Flush choice: GPU receives are flushed under auto (read, or write-read with
// OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE, nothing with OFI_NCCL_GDR_FLUSH_DISABLE); TSNET_FLUSH=read or
// write-read forces every non-empty receive; empty buffers never need one.
import { describe, expect, it } from 'vitest';
import { FlushAction, autoFlush, flushAction, flushBytes } from '../../plugin/transports/ofi/policy/flush';

describe('flush choice', () => {
  it('auto flushes GPU memory by a read, host memory not at all', () => {
    const m = autoFlush(false, false);
    expect(flushAction(m, 'cuda', 4096)).toBe(FlushAction.READ);
    expect(flushAction(m, 'host', 4096)).toBe(FlushAction.NONE);
  });

  it('auto with OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE writes then reads', () => {
    expect(flushAction(autoFlush(false, true), 'cuda', 1)).toBe(FlushAction.WRITE_READ);
  });

  it('OFI_NCCL_GDR_FLUSH_DISABLE wins over the write variant', () => {
    expect(flushAction(autoFlush(true, true), 'cuda', 4096)).toBe(FlushAction.NONE);
  });

  it('forced modes flush host memory too; none flushes nothing', () => {
    expect(flushAction({ method: 'read', all: true }, 'host', 10)).toBe(FlushAction.READ);
    expect(flushAction({ method: 'write-read', all: true }, 'host', 10)).toBe(FlushAction.WRITE_READ);
    expect(flushAction({ method: 'none', all: true }, 'cuda', 10)).toBe(FlushAction.NONE);
  });

  it('empty buffers need no flush', () => {
    expect(flushAction({ method: 'read', all: true }, 'cuda', 0)).toBe(FlushAction.NONE);
  });

  it('reads one cache line, or less of a smaller buffer', () => {
    expect(flushBytes(4)).toBe(4);
    expect(flushBytes(64)).toBe(64);
    expect(flushBytes(1 << 20)).toBe(64);
  });
});
