// TSNET_STATS=steps (plugin/steps.ts): the intervals of each request between the threads it
// crosses, their medians and p99s, and what is left out when a timestamp is missing.
import { describe, expect, it } from 'vitest';
import { Op } from '../../plugin/native';
import { START_REQUESTS, STEP_SAMPLES, Samples, StepStats, bothTraces } from '../../plugin/steps';

describe('Samples', () => {
  it('gives nearest-rank quantiles of what it keeps, and NaN when empty', () => {
    const s = new Samples();
    expect(s.quantile(0.5)).toBeNaN();
    for (let v = 100; v >= 1; v--) s.add(v);
    expect([s.quantile(0.5), s.quantile(0.99), s.quantile(1), s.quantile(0)]).toEqual([50, 99, 100, 1]);
    expect([s.count, s.sum]).toEqual([100, 5050]);
  });

  it('keeps the latest STEP_SAMPLES values for its quantiles and counts every one', () => {
    const s = new Samples();
    for (let k = 0; k < STEP_SAMPLES; k++) s.add(1000);
    for (let k = 0; k < STEP_SAMPLES; k++) s.add(2);
    expect([s.quantile(0.5), s.quantile(1), s.count]).toEqual([2, 2, 2 * STEP_SAMPLES]);
  });
});

describe('StepStats', () => {
  it('splits a send into posted, picked up, its turn (JavaScript entered, requests handled, rings read, submitted), its I/O steps and done', () => {
    const st = new StepStats(256);
    const trace = st.forComm(7);
    st.begin(7, 3, Op.SEND, 100, 101.5);
    st.started(101.7, 102);
    st.flushed(102.5, 103);
    trace.step(3, 'written', 105, 0);
    trace.step(3, 'acknowledged', 109, 1);
    st.end(7, 3, 110);
    expect(st.lines(0)).toEqual([
      'stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 1.50 / 1.50; ' +
        'picked up→in JS 0.20 / 0.20; in JS→handled 0.30 / 0.30; handled→polled 0.50 / 0.50; polled→submitted 0.50 / 0.50; submitted→written 2.00 / 2.00; written→acknowledged 4.00 / 4.00; acknowledged→done 1.00 / 1.00; posted→done 10.0 / 10.0',
    ]);
  });

  it('a send whose frame the protocol thread wrote itself: it ends in the turn\'s poll, timed from the turn\'s start (started), no submission', () => {
    const st = new StepStats(256);
    st.begin(7, 3, Op.SEND, 100, 101.5);
    st.started(101.7, 102);
    st.forComm(7).step(3, 'written here', 101.9, -1);
    st.end(7, 3, 102.6);
    st.flushed(102.9, 103); // the turn's end: the ended request is left as it was
    expect(st.lines(0)).toEqual([
      'stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 1.50 / 1.50; ' +
        'picked up→in JS 0.20 / 0.20; in JS→written here 0.20 / 0.20; in JS→handled 0.30 / 0.30; written here→done 0.70 / 0.70; posted→done 2.60 / 2.60',
    ]);
  });

  it('one line per kind, counts of intervals some requests lack, no step: submitted→done', () => {
    const st = new StepStats(256);
    // a receive whose data had landed: it ends inside the turn that picked it up, before the flush
    st.begin(1, 0, Op.RECV, 10, 20);
    st.forComm(1).step(0, 'landed', 15, 0);
    st.end(1, 0, 21);
    // a receive that waited for its data
    st.begin(1, 1, Op.RECV, 30, 31);
    st.started(31.2, 31.5);
    st.flushed(31.7, 32);
    st.forComm(1).step(1, 'landed', 200, 0);
    st.end(1, 1, 203);
    // a flush with no I/O step
    st.begin(1, 2, Op.FLUSH, 300, 301);
    st.started(301.5, 301.5);
    st.flushed(301.5, 302);
    st.end(1, 2, 350);
    expect(st.lines(2)).toEqual([
      'stats: steps of irecv on protocol thread 2, 2 requests, median / p99 us: posted→picked up 1.00 / 10.0; ' +
        'picked up→in JS 0.20 / 0.20 (1); in JS→handled 0.30 / 0.30 (1); handled→polled 0.20 / 0.20 (1); polled→submitted 0.30 / 0.30 (1); submitted→landed 168 / 168 (1); landed→done 3.00 / 6.00; posted→done 11.0 / 173',
      'stats: steps of iflush on protocol thread 2, 1 requests, median / p99 us: posted→picked up 1.00 / 1.00; picked up→in JS 0.50 / 0.50; in JS→handled 0.00 / 0.00; handled→polled 0.00 / 0.00; polled→submitted 0.50 / 0.50; submitted→done 48.0 / 48.0; posted→done 50.0 / 50.0',
    ]);
  });

  it('ignores steps and ends of slots with nothing in flight, of unknown comms and without a time', () => {
    const st = new StepStats(4);
    st.forComm(9).step(0, 'sent', 5, 0);
    st.end(9, 0, 6);
    st.begin(9, 1, Op.SEND, 1, 2);
    st.forComm(9).step(1, 'sent', 0, 0); // no time: not a step
    st.forComm(9).step(2, 'sent', 5, 0); // another slot
    st.begin(9, 4, Op.SEND, 1, 2); // past the comm's slots
    st.end(9, 1, 4);
    st.end(9, 1, 8); // ended already
    expect(st.lines(0)).toEqual([
      'stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 1.00 / 1.00; posted→done 3.00 / 3.00',
    ]);
  });

  it('forgets a closed comm\'s requests in flight, and keeps what it counted', () => {
    const st = new StepStats(256);
    st.begin(1, 0, Op.SEND, 1, 2);
    st.end(1, 0, 5);
    st.begin(1, 1, Op.SEND, 10, 12);
    st.forget(1);
    st.end(1, 1, 20); // closed: nothing to end
    expect(st.lines(0)).toEqual(['stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 1.00 / 1.00; posted→done 4.00 / 4.00']);
  });

  it('counts the first START_REQUESTS requests of a kind apart too, once there are more', () => {
    const st = new StepStats(4);
    const send = (n: number, wait: number) => {
      for (let k = 0; k < n; k++) {
        st.begin(1, 0, Op.SEND, 10, 10 + wait);
        st.end(1, 0, 20);
      }
    };
    send(START_REQUESTS, 5);
    expect(st.lines(0)).toEqual([`stats: steps of isend on protocol thread 0, ${START_REQUESTS} requests, median / p99 us: posted→picked up 5.00 / 5.00; posted→done 10.0 / 10.0`]);
    send(1.5 * START_REQUESTS, 1);
    st.begin(1, 0, Op.RECV, 1, 2);
    st.end(1, 0, 3);
    expect(st.lines(3)).toEqual([
      `stats: steps of isend on protocol thread 3, ${2.5 * START_REQUESTS} requests, median / p99 us: posted→picked up 1.00 / 5.00; posted→done 10.0 / 10.0`,
      `stats: steps of isend on protocol thread 3, its first ${START_REQUESTS} requests, median / p99 us: posted→picked up 5.00 / 5.00; posted→done 10.0 / 10.0`,
      'stats: steps of irecv on protocol thread 3, 1 requests, median / p99 us: posted→picked up 1.00 / 1.00; posted→done 2.00 / 2.00',
    ]);
  });

  it('counts the warm-up\'s requests apart, after NCCL\'s, and keeps them out of NCCL\'s first requests', () => {
    const st = new StepStats(4);
    for (let k = 0; k < 3; k++) {
      st.begin(1, 0, Op.SEND, 10, 19, true);
      st.end(1, 0, 20);
    }
    st.begin(2, 0, Op.SEND, 10, 11);
    st.end(2, 0, 20);
    st.begin(1, 1, Op.RECV, 10, 12, true);
    st.forComm(1).step(1, 'landed', 15, 0);
    st.end(1, 1, 16);
    expect(st.lines(0)).toEqual([
      'stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 1.00 / 1.00; posted→done 10.0 / 10.0',
      'stats: steps of isend of the warm-up on protocol thread 0, 3 requests, median / p99 us: posted→picked up 9.00 / 9.00; posted→done 10.0 / 10.0',
      'stats: steps of irecv of the warm-up on protocol thread 0, 1 requests, median / p99 us: posted→picked up 2.00 / 2.00; landed→done 1.00 / 1.00; posted→done 6.00 / 6.00',
    ]);
  });

  it('reuses a slot: a new begin forgets the old request', () => {
    const st = new StepStats(256);
    st.begin(1, 0, Op.SEND, 1, 2);
    st.forComm(1).step(0, 'sent', 3, 0);
    st.begin(1, 0, Op.SEND, 10, 12);
    st.end(1, 0, 20);
    expect(st.lines(0)[0]).toBe('stats: steps of isend on protocol thread 0, 1 requests, median / p99 us: posted→picked up 2.00 / 2.00; posted→done 10.0 / 10.0');
  });
});

describe('bothTraces', () => {
  it('is either one alone, or both called in turn', () => {
    const seen: string[] = [];
    const a = { step: (slot: number, what: string) => void seen.push(`a ${slot} ${what}`) };
    const b = { step: (slot: number, what: string) => void seen.push(`b ${slot} ${what}`) };
    expect(bothTraces(a, undefined)).toBe(a);
    expect(bothTraces(undefined, b)).toBe(b);
    expect(bothTraces(undefined, undefined)).toBeUndefined();
    bothTraces(a, b)!.step(3, 'sent', 1, 0);
    expect(seen).toEqual(['a 3 sent', 'b 3 sent']);
  });
});
