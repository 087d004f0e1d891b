// A protocol thread whose event loop was held: the watchdog's WARN says what the thread did
// meanwhile (plugin/stats.ts holdLine).
import { describe, expect, it } from 'vitest';
import { type HoldSample, holdLine } from '../../plugin/stats';

const at = (cpuMs: number, busyMs: number, waitMs: number, longest?: [string, number]): HoldSample => ({
  cpu: cpuMs * 1000,
  busy: busyMs * 1000,
  wait: waitMs < 0 ? -1 : waitMs * 1000,
  longest: longest ? { what: longest[0], us: longest[1] * 1000 } : { what: null, us: 0 },
});

describe('the watchdog\'s account of a held event loop', () => {
  const base = at(100, 50, 10);

  it('names the host when the thread waited for a CPU most of the time', () => {
    expect(holdLine(9000, base, at(300, 60, 8500, ['turn', 2]))).toBe(
      'meanwhile the thread used 200 ms of CPU, 10 ms in tsnet\'s turns and calls (the longest: turn, 2 ms), and waited 8490 ms for a CPU: the host gave it no CPU',
    );
  });

  it('names the call that held it running, or tsnet\'s work when no single call did', () => {
    expect(holdLine(9000, base, at(9100, 9050, 20, ['closeRecv', 8900]))).toMatch(/: its call closeRecv held it, running$/);
    expect(holdLine(9000, base, at(9100, 9050, 20, ['regMr', 30]))).toMatch(/\(the longest: regMr, 30 ms\).*: tsnet's own work held it, running$/);
  });

  it('tells a call the thread sat in without running (a lock, a stop inside it) from one that ran', () => {
    expect(holdLine(9000, base, at(150, 9050, 20, ['turn', 8990]))).toMatch(
      /: it sat in its call turn, neither running nor waiting for a CPU: blocked \(a lock, a system call\), or the process was stopped$/,
    );
  });

  it('tells code outside tsnet\'s calls, and a wait that used no CPU', () => {
    expect(holdLine(2000, base, at(2100, 60, 10))).toMatch(/used 2000 ms of CPU, 10 ms in tsnet's turns and calls, and waited 0 ms for a CPU: code outside tsnet's calls held it, running$/);
    expect(holdLine(2000, base, at(110, 55, 12, ['connect', 1]))).toMatch(/: it neither ran nor waited for a CPU: blocked \(a lock, a system call\), not woken, or the process was stopped$/);
  });

  it('leaves the run-queue figure out where the kernel does not give it', () => {
    const line = holdLine(2000, at(0, 0, -1), at(1900, 0, -1));
    expect(line).not.toMatch(/waited/);
    expect(line).toMatch(/: code outside tsnet's calls held it, running$/);
  });
});
