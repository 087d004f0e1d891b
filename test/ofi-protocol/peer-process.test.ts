// A dead peer on the same host, noticed by its process (plugin/transports/ofi/peer-process.ts):
// CONNECT and ACCEPT carry boot id, pid and start time; where the boot ids are equal, a comm with
// requests pending whose peer has been quiet for PROBE_MS looks the process up and fails when it
// is gone, a zombie, or its pid names a later process. Where the pid does not name the same
// process here (another pid namespace) or no start time came, only the silence of the timeout
// tells, with one INFO line per endpoint; a peer on another host (another boot id) is left to
// the silence without a word.
import { describe, expect, it } from 'vitest';
import { PROBE_MS, PeerProcesses, type ProcInfo, parseProcStat, readBootId, readProcStat } from '../../plugin/transports/ofi/peer-process';
import { captureLog } from '../support/log-capture';
import { World, buf } from './harness';

const log = captureLog();
const warns = () => log.filter((l) => l.level === 2).map((l) => l.msg);
const infos = () => log.filter((l) => l.level === 3).map((l) => l.msg);

/** One process table seen the same from both sides: pid 1000 is side a, 1001 side b. */
function table(): Map<number, ProcInfo> {
  return new Map([
    [1000, { state: 'S', start: 111 }],
    [1001, { state: 'R', start: 222 }],
  ]);
}

/**
 * Side b waits in a receive from side a; then a's clock stops (it sends nothing more, as a dead
 * process over shm, whose writes into its region still complete) and b's view of its process is
 * changed by `after`. Only b's clock runs, in steps of 100 ms.
 */
function deadSender(
  procs: (side: string) => Map<number, ProcInfo>,
  after: (t: Map<number, ProcInfo>) => void,
  timeoutMs = 10_000,
  bootId?: (side: string) => Uint8Array,
) {
  const views = { a: procs('a'), b: procs('b') };
  const w = new World({ timeoutMs, procStat: (side) => (pid) => views[side as 'a' | 'b'].get(pid) ?? null, bootId });
  const { recv } = w.connect();
  const dst = w.b.region(4096);
  recv.irecv(1, [buf(dst, 0, 100, 0)]);
  w.settle();
  after(views.b);
  const t0 = w.now;
  while (!w.b.has(1) && w.now - t0 < 2 * timeoutMs) {
    w.now += 100;
    w.b.ep.tick(w.now);
    w.settle();
  }
  return { w, ms: w.now - t0, done: w.b.take(1) };
}

describe('a dead peer on this host, by its process', () => {
  it('gone from /proc: the receive fails with a remote error within PROBE_MS of quiet, not at the 10 s timeout', () => {
    const t = table();
    const r = deadSender(() => t, (v) => v.delete(1000));
    expect(r.done.code).toBe(6);
    expect(r.ms).toBeLessThanOrEqual(PROBE_MS + 100);
    expect(warns().join('\n')).toMatch(/recv comm \d+: the peer's process 1000 has exited; failing 1 pending request\(s\)/);
    expect(warns().join('\n')).not.toMatch(/nothing heard/);
  });

  it('a zombie is dead', () => {
    const t = table();
    const r = deadSender(() => t, (v) => v.set(1000, { state: 'Z', start: 111 }));
    expect(r.done.code).toBe(6);
    expect(r.ms).toBeLessThanOrEqual(PROBE_MS + 100);
    expect(warns().join('\n')).toMatch(/the peer's process 1000 has exited \(state Z\)/);
  });

  it('its pid taken by a later process is dead', () => {
    const t = table();
    const r = deadSender(() => t, (v) => v.set(1000, { state: 'S', start: 999 }));
    expect(r.done.code).toBe(6);
    expect(warns().join('\n')).toMatch(/process 1000 has exited \(its pid now names a later process\)/);
  });

  it('the sending side notices a dead receiver the same way', () => {
    const t = table();
    const w = new World({ timeoutMs: 10_000, procStat: () => (pid) => t.get(pid) ?? null });
    const { send } = w.connect();
    const src = w.a.region(1 << 20);
    send.isend(1, buf(src, 0, 100_000, 0)); // waits for its control message
    w.settle();
    w.fabric.kill(w.b.host);
    t.delete(1001);
    for (let i = 0; i < 4 && !w.a.has(1); i++) {
      w.advance(100);
      w.settle();
    }
    expect(w.a.take(1).code).toBe(6);
    expect(warns().join('\n')).toMatch(/send comm \d+: the peer's process 1001 has exited/);
  });

  it('a live peer is not failed, however often it is probed: a quiet one ends only by the timeout', () => {
    const t = table();
    const r = deadSender(() => t, () => {}, 2000); // silent, but alive in /proc: a stuck peer
    expect(r.done.code).toBe(6);
    expect(r.ms).toBeGreaterThan(2000);
    expect(warns().join('\n')).toMatch(/nothing heard from the peer for 2\.\d s/);
  });

  it('another pid namespace: the pid names another process here, so only silence tells, and INFO says why once', () => {
    const r = deadSender(
      (side) => (side === 'a' ? table() : new Map([[1000, { state: 'S', start: 5 }], [1001, { state: 'R', start: 222 }]])),
      (v) => v.delete(1000),
      2000,
    );
    expect(r.done.code).toBe(6);
    expect(r.ms).toBeGreaterThan(2000);
    expect(infos().filter((m) => /noticed by silence only/.test(m))).toEqual([
      'b: a dead peer is noticed by silence only (TSNET_TIMEOUT_SEC), not by its process: process 1000 here started at 5, the peer\'s at 111 (another pid namespace)',
    ]);
  });

  it('a peer on another host (another boot id) is left to the silence, without a word', () => {
    const t = table();
    const r = deadSender(() => t, (v) => v.delete(1000), 2000, (side) => new Uint8Array(16).fill(side === 'a' ? 1 : 2));
    expect(r.done.code).toBe(6);
    expect(r.ms).toBeGreaterThan(2000);
    expect(warns().join('\n')).toMatch(/nothing heard from the peer/);
    expect(infos().filter((m) => /noticed by silence only/.test(m))).toEqual([]);
  });

  it('an unknown boot id (zeros) on either side is not this host', () => {
    const p = new PeerProcesses(() => ({ state: 'S', start: 1 }), 1, 1, new Uint8Array(16).fill(3));
    expect(p.sameHost(new Uint8Array(16).fill(3))).toBe(true);
    expect(p.sameHost(new Uint8Array(16))).toBe(false);
    expect(p.sameHost(new Uint8Array(16).fill(4))).toBe(false);
    expect(new PeerProcesses(() => null, 1, 1, new Uint8Array(16)).sameHost(new Uint8Array(16))).toBe(false);
  });

  it('a peer that /proc hides, or that sent no start time, is not watched', () => {
    const p = new PeerProcesses((pid) => (pid === 7 ? { state: 'S', start: 70 } : null), 7);
    expect(p.selfStart).toBe(70);
    expect(p.check(8, 80)).toMatch(/process 8 is not visible here/);
    expect(p.check(7, 0)).toMatch(/sent no process id or start time/);
    expect(p.check(7, 70)).toBe(true);
    expect(p.gone(7, 70)).toBeNull();
  });
});

describe('/proc/<pid>/stat', () => {
  it('reads the state and start time past a command name with spaces and parentheses', () => {
    const fields = Array.from({ length: 50 }, (_, i) => String(i + 3)); // field k holds k
    fields[0] = 'Z';
    expect(parseProcStat(`4242 (a (b) c) ${fields.join(' ')}`)).toEqual({ state: 'Z', start: 22 });
    expect(parseProcStat('garbage')).toBeNull();
    expect(parseProcStat('1 (x) S 1 2')).toBeNull();
  });

  it('this kernel\'s boot id: 16 bytes, not all zero, the same on every read', () => {
    const a = readBootId();
    expect(a.length).toBe(16);
    expect(a.some((x) => x !== 0)).toBe(true);
    expect(readBootId()).toEqual(a);
  });

  it('this process: running or sleeping, started before now; a pid that does not exist: null', () => {
    const me = readProcStat(process.pid);
    expect(me).not.toBeNull();
    expect(me!.start).toBeGreaterThan(0);
    expect(['R', 'S', 'D']).toContain(me!.state);
    expect(readProcStat(0)).toBeNull();
    expect(readProcStat(2 ** 22 + 12345)).toBeNull(); // above the kernel's pid_max
  });
});
