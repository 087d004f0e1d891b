// The sender's matcher: the earliest posted receive with an unused entry of the send's tag,
// equal tags in order, different tags out of order, sends waiting for control messages.
import { describe, expect, it } from 'vitest';
import { SharedSendMatcher } from '../../plugin/transports/ofi/matcher';

function make() {
  const matches: [string | number, number, number][] = [];
  const full: number[] = [];
  const m = new SharedSendMatcher<string | number>({ onMatch: (s, r, i) => matches.push([s, r, i]), onFull: (r) => full.push(r) });
  return { m, matches, full };
}

describe('SharedSendMatcher', () => {
  it('matches a receive A (tag 8) posted before B (tags 0-7): tag 0 fills B[0], tag 8 fills A', () => {
    const { m, matches, full } = make();
    m.post(0, 1, [8]);
    m.post(1, 8, [0, 1, 2, 3, 4, 5, 6, 7]);
    for (const t of [0, 8, 1, 2, 3, 4, 5, 6, 7]) expect(m.arrive(`t${t}`, t)).toBe(true);
    expect(matches.slice(0, 2)).toEqual([
      ['t0', 1, 0],
      ['t8', 0, 0],
    ]);
    expect(full).toEqual([0, 1]);
    expect(m.oldest).toBe(2);
  });

  it('the same works when the sends come before the control messages', () => {
    const { m, matches } = make();
    for (const t of [0, 8, 1, 2, 3, 4, 5, 6, 7]) expect(m.arrive(`t${t}`, t)).toBe(false);
    expect(m.queued).toBe(9);
    m.post(0, 1, [8]);
    expect(matches).toEqual([['t8', 0, 0]]);
    m.post(1, 8, [0, 1, 2, 3, 4, 5, 6, 7]);
    expect(matches.slice(1).map((x) => x[0])).toEqual(['t0', 't1', 't2', 't3', 't4', 't5', 't6', 't7']);
    expect(m.queued).toBe(0);
  });

  it('equal tags keep their order; a tag used up in a group is pushed back to the next', () => {
    const { m, matches } = make();
    m.post(0, 2, [5, 6]);
    m.post(1, 2, [5, 5]);
    expect(m.arrive('a', 5)).toBe(true);
    expect(m.arrive('b', 5)).toBe(true);
    expect(m.arrive('c', 5)).toBe(true);
    expect(m.arrive('d', 5)).toBe(false);
    expect(matches).toEqual([
      ['a', 0, 0],
      ['b', 1, 0],
      ['c', 1, 1],
    ]);
    m.post(2, 1, [5]);
    expect(matches[3]).toEqual(['d', 2, 0]);
  });

  it('waiting sends match new receives in send order, skipping tags the receive lacks', () => {
    const { m, matches } = make();
    m.arrive('x1', 1);
    m.arrive('x2', 2);
    m.arrive('y1', 1);
    m.post(0, 2, [2, 1]);
    expect(matches).toEqual([
      ['x1', 0, 1],
      ['x2', 0, 0],
    ]);
    expect(m.queued).toBe(1);
    m.post(1, 1, [1]);
    expect(matches[2]).toEqual(['y1', 1, 0]);
  });

  it('a send whose tag no known receive has waits; later sends may pass it', () => {
    const { m, matches } = make();
    m.post(0, 2, [1, 2]);
    expect(m.arrive('nine', 9)).toBe(false);
    expect(m.arrive('two', 2)).toBe(true);
    expect(matches).toEqual([['two', 0, 1]]);
  });

  it('rejects receives out of order', () => {
    const { m } = make();
    expect(() => m.post(1, 1, [0])).toThrow(/expected 0/);
  });

  it('queues any number of sends', () => {
    const { m, matches } = make();
    for (let i = 0; i < 300; i++) m.arrive(i, i % 3);
    for (let r = 0; r < 100; r++) m.post(r, 3, [0, 1, 2]);
    expect(matches.map((x) => x[0])).toEqual(Array.from({ length: 300 }, (_, i) => i));
  });
});
