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
