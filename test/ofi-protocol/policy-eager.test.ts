// Eager threshold: the 8-byte header counts against OFI_NCCL_EAGER_MAX_SIZE, -1 disables,
// the peer's bounce capacity caps it, and a send goes eager only when nothing earlier waits.
import { describe, expect, it } from 'vitest';
import { EAGER_HEADER_BYTES, EAGER_MAX_QUEUED, eagerLimit, fitsEager, mayGoEager } from '../../plugin/transports/ofi/policy/eager';

describe('eager threshold', () => {
  it('counts the header: limit - 8 bytes fit, limit - 7 do not', () => {
    expect(EAGER_HEADER_BYTES).toBe(8);
    expect(fitsEager(8192 - 8, 8192)).toBe(true);
    expect(fitsEager(8192 - 7, 8192)).toBe(false);
    expect(fitsEager(0, 8192)).toBe(true);
    expect(fitsEager(0, 8)).toBe(true);
    expect(fitsEager(0, 7)).toBe(false);
  });

  it('-1 disables eager entirely, even for empty messages', () => {
    expect(fitsEager(0, -1)).toBe(false);
    expect(eagerLimit(-1, 8192)).toBe(-1);
    expect(eagerLimit(8192, -1)).toBe(-1);
  });

  it('the limit is the smaller of ours and what the peer holds', () => {
    expect(eagerLimit(8192, 4096)).toBe(4096);
    expect(eagerLimit(1024, 8192)).toBe(1024);
    expect(eagerLimit(0, 8192)).toBe(0);
  });

  it('goes eager only with room in the queue and no earlier send waiting', () => {
    expect(mayGoEager(100, 8192, 0, 0)).toBe(true);
    expect(mayGoEager(100, 8192, EAGER_MAX_QUEUED - 1, 0)).toBe(true);
    expect(mayGoEager(100, 8192, EAGER_MAX_QUEUED, 0)).toBe(false);
    expect(mayGoEager(100, 8192, 0, 1)).toBe(false);
    expect(mayGoEager(9000, 8192, 0, 0)).toBe(false);
    expect(mayGoEager(100, 8192, 0, 0, true)).toBe(true);
    expect(mayGoEager(100, 8192, 0, 0, true, false)).toBe(false);
    expect(mayGoEager(100, 8192, 0, 0, false, false)).toBe(true);
  });
});
