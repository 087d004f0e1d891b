// Refused strangers on a listener (plugin/transports/tcp/refusals.ts): every refusal at
// TRACE, the first few at WARN, then one counting WARN per interval, on an injected clock
// and timer, with the plugin's log captured.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { LogLevel } from '../../plugin/abi';
import { setLogSink } from '../../plugin/log';
import { RefusalLog } from '../../plugin/transports/tcp/refusals';

const lines: { level: number; msg: string }[] = [];
beforeEach(() => {
  lines.length = 0;
  setLogSink((level, _flags, msg) => lines.push({ level, msg }), true);
});
afterEach(() => setLogSink(() => {}));

const warns = () => lines.filter((l) => l.level === LogLevel.WARN).map((l) => l.msg);
const traces = () => lines.filter((l) => l.level === LogLevel.TRACE).map((l) => l.msg);

/** A clock and one-shot timers that run only when the test advances time. */
function fakeTime() {
  let t = 1_000_000;
  let timers: { at: number; fn: () => void }[] = [];
  return {
    now: () => t,
    after: (ms: number, fn: () => void) => {
      const timer = { at: t + ms, fn };
      timers.push(timer);
      return () => {
        timers = timers.filter((x) => x !== timer);
      };
    },
    /** Moves the clock on by ms, running each timer that falls due at its own time. */
    advance(ms: number) {
      const end = t + ms;
      for (;;) {
        const due = timers.filter((x) => x.at <= end).sort((a, b) => a.at - b.at)[0];
        if (!due) break;
        timers = timers.filter((x) => x !== due);
        t = due.at;
        due.fn();
      }
      t = end;
    },
    pending: () => timers.length,
  };
}

function refusals(firstWarns = 3, intervalMs = 10_000) {
  const time = fakeTime();
  const r = new RefusalLog('listener on lo', { now: time.now, after: time.after, firstWarns, intervalMs });
  return { r, time };
}

describe('refusals', () => {
  it('warns the first few one by one, naming peer and reason, and says counting starts', () => {
    const { r } = refusals(3);
    r.refuse('10.0.0.1:1', 'bad magic');
    r.refuse('10.0.0.2:2', 'wrong nonce (a stale handle or a stranger)');
    r.refuse('10.0.0.3:3', 'closed before greeting');
    expect(warns()).toEqual([
      'listener on lo: refused a connection from 10.0.0.1:1: bad magic',
      'listener on lo: refused a connection from 10.0.0.2:2: wrong nonce (a stale handle or a stranger)',
      'listener on lo: refused a connection from 10.0.0.3:3: closed before greeting (3 refused: further refusals are counted, one WARN per 10 s)',
    ]);
  });

  it('a burst of 1,000 gives the first few WARNs, then one counting WARN when the interval ends; every refusal at TRACE', () => {
    const { r, time } = refusals(5);
    for (let i = 0; i < 1000; i++) {
      r.refuse(`10.0.0.9:${i}`, i % 2 ? 'bad magic' : 'closed before greeting');
      time.advance(1); // a burst of 1 s
    }
    expect(warns().length).toBe(5);
    expect(traces().length).toBe(1000);
    expect(traces()[999]).toBe('listener on lo: refused a connection from 10.0.0.9:999: bad magic');
    expect(time.pending()).toBe(1);
    time.advance(10_000);
    expect(warns().length).toBe(6);
    expect(warns()[5]).toBe('listener on lo: refused 995 more connections in 10.0 s (1000 in all), the last from 10.0.0.9:999: bad magic');
    expect(time.pending()).toBe(0);
    // Quiet afterwards: nothing more.
    time.advance(60_000);
    expect(warns().length).toBe(6);
  });

  it('a steady flood gives at most one WARN per interval', () => {
    const { r, time } = refusals(2, 1000);
    for (let ms = 0; ms < 10_000; ms += 10) {
      r.refuse('10.0.0.1:5', 'bad magic');
      time.advance(10);
    }
    const counted = warns().slice(2);
    expect(counted.length).toBe(9); // at 1.01 s, 2.01 s, ... 9.01 s after the second WARN
    expect(counted[0]).toBe('listener on lo: refused 99 more connections in 1.0 s (101 in all), the last from 10.0.0.1:5: bad magic');
    expect(counted.slice(1).every((w) => /refused 100 more connections in 1\.0 s/.test(w))).toBe(true);
    expect(traces().length).toBe(1000);
    r.close();
    expect(warns()[11]).toMatch(/refused 99 more connections in 1\.0 s \(1000 in all\)/);
  });

  it('a refusal after a quiet interval is counted at once, alone', () => {
    const { r, time } = refusals(1, 1000);
    r.refuse('a:1', 'bad magic');
    time.advance(5000);
    r.refuse('b:2', 'wrong nonce');
    expect(warns()).toEqual([
      'listener on lo: refused a connection from a:1: bad magic (1 refused: further refusals are counted, one WARN per 1 s)',
      'listener on lo: refused 1 more connection in 5.0 s (2 in all), the last from b:2: wrong nonce',
    ]);
    expect(time.pending()).toBe(0);
  });

  it('close writes the count not yet written and cancels the timer; closing again writes nothing', () => {
    const { r, time } = refusals(1);
    r.refuse('a:1', 'x');
    time.advance(100);
    r.refuse('a:2', 'y');
    r.refuse('a:3', 'z');
    expect(time.pending()).toBe(1);
    time.advance(400);
    r.close();
    r.close();
    expect(warns().slice(1)).toEqual(['listener on lo: refused 2 more connections in 0.5 s (3 in all), the last from a:3: z']);
    expect(time.pending()).toBe(0);
  });

  it('close with nothing held writes nothing', () => {
    const { r } = refusals(5);
    r.refuse('a:1', 'x');
    r.close();
    expect(warns().length).toBe(1);
  });

  it('the defaults: 5 WARNs, then counted per 10 s, on the real clock and timers', () => {
    const r = new RefusalLog('listener on eth0');
    for (let i = 0; i < 20; i++) r.refuse('10.1.1.1:7', 'bad magic');
    expect(warns().length).toBe(5);
    expect(warns()[4]).toMatch(/one WARN per 10 s\)$/);
    r.close();
    expect(warns()[5]).toMatch(/^listener on eth0: refused 15 more connections in \d+\.\d s \(20 in all\)/);
  });
});
