// Regions.find (plugin/memory.ts): the address lookup of the loopback transport's memory link,
// with regions that overlap as NCCL's may (one buffer registered whole and in part).
import { describe, expect, it } from 'vitest';
import { Regions } from '../../plugin/memory';

const KiB = 1024;

function regions(list: [number, number][]): Regions {
  const rs = new Regions();
  list.forEach(([base, size], i) => rs.add(i + 1, 1, new ArrayBuffer(size), base, size));
  return rs;
}

describe('Regions.find', () => {
  it('a range only the larger of two regions with the same base holds: that one, whatever else is registered', () => {
    // Other regions around them change the binary search's path; the answer must not change.
    for (const others of [[], [[0x1000, 64]], [[0x1000, 64], [0x2000, 64]], [[0x90000, 64]], [[0x1000, 64], [0x90000, 64], [0xa0000, 64]]] as [number, number][][]) {
      for (const order of [[[0x10000, 4 * KiB], [0x10000, 16 * KiB]], [[0x10000, 16 * KiB], [0x10000, 4 * KiB]]] as [number, number][][]) {
        const rs = regions([...others, ...order]);
        expect(rs.find(0x10000, 16 * KiB)?.size, JSON.stringify({ others, order })).toBe(16 * KiB);
        expect(rs.find(0x10000 + 8 * KiB, 8 * KiB)?.size).toBe(16 * KiB);
        expect([4 * KiB, 16 * KiB]).toContain(rs.find(0x10000, 4 * KiB)?.size);
        expect(rs.find(0x10000, 16 * KiB + 1)).toBeUndefined();
      }
    }
  });

  it('a region inside another, and a range that starts in the inner one and ends past it', () => {
    const rs = regions([[0x10000, 64 * KiB], [0x14000, 4 * KiB]]);
    expect(rs.find(0x14000, 4 * KiB)?.base).toBe(0x14000); // the highest base that holds it
    expect(rs.find(0x14000, 8 * KiB)?.base).toBe(0x10000);
    expect(rs.find(0x1f000, 4 * KiB)?.base).toBe(0x10000);
    expect(rs.find(0x1f000, 4 * KiB + 1)).toBeUndefined();
  });

  it('nothing below the first region, between regions, or past the last; view of what is found', () => {
    const rs = regions([[0x10000, 4 * KiB], [0x20000, 4 * KiB]]);
    expect(rs.find(0xffff, 1)).toBeUndefined();
    expect(rs.find(0x11000, 1)).toBeUndefined();
    expect(rs.find(0x21000, 1)).toBeUndefined();
    expect(rs.find(0x20fff, 1)?.base).toBe(0x20000);
    expect(rs.view(0x20010, 16).length).toBe(16);
    expect(() => rs.view(0x20ff0, 32)).toThrow(/no registered host region holds 32 bytes at 0x20ff0/);
    rs.delete(2);
    expect(rs.find(0x20000, 1)).toBeUndefined();
  });
});

describe('Regions kept in order', () => {
  it('thousands of regions added and deleted in a shuffled order: every lookup finds the region that holds it', () => {
    // A fixed permutation (a multiplicative step modulo a prime): regions added out of order,
    // some with the same base as another (registered whole and in part), deleted in another order.
    const N = 997;
    const rs = new Regions();
    const base = (k: number) => 0x10_0000 + k * 0x1000;
    for (let i = 0; i < N; i++) {
      const k = (i * 389) % N;
      rs.add(2 * k + 1, 1, new ArrayBuffer(0), base(k), 0x1000);
      if (k % 3 === 0) rs.add(2 * k + 2, 1, new ArrayBuffer(0), base(k), 0x800);
    }
    for (let k = 0; k < N; k++) {
      expect(rs.find(base(k), 0x1000)?.id).toBe(2 * k + 1);
      expect(rs.find(base(k) + 0x800, 0x800)?.id).toBe(2 * k + 1);
      expect(rs.find(base(k) + 0x7ff, 1)?.id).toBe(k % 3 === 0 ? 2 * k + 2 : 2 * k + 1); // the later of two with one base
    }
    for (let i = 0; i < N; i++) {
      const k = (i * 577) % N;
      if (k % 2 === 0) expect(rs.delete(2 * k + 1)?.id).toBe(2 * k + 1);
    }
    for (let k = 0; k < N; k++) {
      if (k % 2 === 0) expect(rs.find(base(k), 0x1000), `region ${k}`).toBeUndefined();
      else expect(rs.find(base(k), 0x1000)?.id).toBe(2 * k + 1);
      if (k % 3 === 0) expect(rs.find(base(k), 0x800)?.id).toBe(2 * k + 2);
      else if (k % 2 === 0) expect(rs.find(base(k), 0x800)).toBeUndefined();
    }
    expect(rs.delete(1)).toBeUndefined(); // region 0's, deleted already
  });
});
