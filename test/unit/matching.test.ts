// Receive-side matching: FIFO over posted receives, tags pick the buffer of a multi-receive,
// duplicate tags, unknown tags and oversize messages fail.
import { describe, expect, it } from 'vitest';
import { assign, fullyAssigned, newPostedRecv } from '../../plugin/protocol/matching';

const bufs = (...spec: [size: number, tag: number][]) => spec.map(([size, tag]) => ({ size, tag }));

describe('matching', () => {
  it('a new receive has nothing assigned', () => {
    const r = newPostedRecv(7, bufs([10, 0], [20, 1]));
    expect(r).toMatchObject({ slot: 7, assigned: [false, false], arrived: 0, sizes: [0, 0], failed: false });
    expect(fullyAssigned(r)).toBe(false);
  });

  it('a single receive takes one message and reports its size', () => {
    const r = newPostedRecv(0, bufs([100, 5]));
    expect(assign(r, 5, 60)).toEqual({ ok: true, index: 0 });
    expect(r.sizes).toEqual([60]);
    expect(fullyAssigned(r)).toBe(true);
  });

  it('a message exactly the size of its buffer fits; empty messages fit empty buffers', () => {
    expect(assign(newPostedRecv(0, bufs([100, 0])), 0, 100).ok).toBe(true);
    expect(assign(newPostedRecv(0, bufs([0, 0])), 0, 0).ok).toBe(true);
  });

  it('tags pick buffers of a multi-receive, whatever the order messages come in', () => {
    const r = newPostedRecv(1, bufs([10, 0], [20, 1], [30, 2], [40, 3]));
    expect(assign(r, 2, 25)).toEqual({ ok: true, index: 2 });
    expect(assign(r, 0, 5)).toEqual({ ok: true, index: 0 });
    expect(fullyAssigned(r)).toBe(false);
    expect(assign(r, 3, 40)).toEqual({ ok: true, index: 3 });
    expect(assign(r, 1, 1)).toEqual({ ok: true, index: 1 });
    expect(r.sizes).toEqual([5, 1, 25, 40]);
    expect(r.assigned).toEqual([true, true, true, true]);
    expect(fullyAssigned(r)).toBe(true);
  });

  it('duplicate tags fill their buffers in order', () => {
    const r = newPostedRecv(0, bufs([10, 4], [20, 9], [30, 4], [40, 4]));
    expect(assign(r, 4, 1).index).toBe(0);
    expect(assign(r, 4, 2).index).toBe(2);
    expect(assign(r, 9, 3).index).toBe(1);
    expect(assign(r, 4, 4).index).toBe(3);
    expect(r.sizes).toEqual([1, 3, 2, 4]);
  });

  it('a duplicate tag whose buffers are taken no longer matches', () => {
    const r = newPostedRecv(0, bufs([10, 4], [20, 4], [30, 1]));
    assign(r, 4, 1);
    assign(r, 4, 1);
    const m = assign(r, 4, 1);
    expect(m.ok).toBe(false);
    expect(m.index).toBe(2);
  });

  it('an unknown tag fails and takes the first free buffer, naming the tags', () => {
    const r = newPostedRecv(0, bufs([10, 0], [20, 1], [30, 2]));
    assign(r, 0, 1);
    const m = assign(r, 42, 5);
    expect(m).toMatchObject({ ok: false, index: 1 });
    if (!m.ok) {
      expect(m.reason).toContain('tag 42');
      expect(m.reason).toContain('0, 1, 2');
    }
    expect(r.assigned).toEqual([true, true, false]);
    expect(r.sizes).toEqual([1, 0, 0]);
  });

  it('a message larger than its buffer fails, naming both sizes and the tag', () => {
    const r = newPostedRecv(0, bufs([100, 3]));
    const m = assign(r, 3, 101);
    expect(m).toMatchObject({ ok: false, index: 0 });
    if (!m.ok) expect(m.reason).toMatch(/101-byte send.*100-byte receive.*tag 3/);
    expect(r.assigned).toEqual([true]);
  });

  it('an oversize message in a multi-receive takes its tag\'s buffer, not a larger free one', () => {
    const r = newPostedRecv(0, bufs([10, 0], [1000, 1]));
    const m = assign(r, 0, 11);
    expect(m).toMatchObject({ ok: false, index: 0 });
    expect(r.assigned).toEqual([true, false]);
  });

  it('throws when every buffer is taken (a caller bug)', () => {
    const r = newPostedRecv(0, bufs([10, 0]));
    assign(r, 0, 1);
    expect(() => assign(r, 0, 1)).toThrow(/no free buffer/);
  });
});
