// TSNET_STATS's line of the process's CPU by thread (plugin/stats.ts): /proc's stat lines
// read, tsnet's threads told from the rest of the process.
import { describe, expect, it } from 'vitest';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { constants as perf } from 'node:perf_hooks';
import { GcStats, SETUP_BUCKETS, TimeHistogram, gcStatsLine, newSetupStats, parseThreadStat, processCpuLine, readProcessCpu, readThreadsCpu, setupStatsLines } from '../../plugin/stats';

// A stat line as proc(5) writes it: utime 250 and stime 50 ticks (3 s at USER_HZ 100).
const statLine = (tid: number, name: string, utime: number, stime: number) =>
  `${tid} (${name}) S 1 ${tid} ${tid} 0 -1 4194368 100 0 0 0 ${utime} ${stime} 0 0 20 0 12 0 1234 1000000 100 18446744073709551615\n`;

describe('the CPU of each thread of the process', () => {
  it('reads the name and utime + stime of a stat line, a name with spaces and parentheses included', () => {
    expect(parseThreadStat(statLine(7, 'tsnet-io3', 250, 50))).toEqual({ name: 'tsnet-io3', us: 3e6 });
    expect(parseThreadStat(statLine(8, 'a (b) c', 1, 0))).toEqual({ name: 'a (b) c', us: 1e4 });
    expect(parseThreadStat('not a stat line')).toBeUndefined();
    expect(parseThreadStat('9 (short) S 1')).toBeUndefined();
  });

  it('reads every thread of a task folder and skips the ones that are gone or unreadable', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-task-'));
    try {
      for (const [tid, name, u, s] of [[11, 'app', 100, 0], [12, 'tsnet-io0', 30, 20]] as const) {
        fs.mkdirSync(path.join(dir, String(tid)));
        fs.writeFileSync(path.join(dir, String(tid), 'stat'), statLine(tid, name, u, s));
      }
      fs.mkdirSync(path.join(dir, '13')); // ended between readdir and read: no stat file
      expect(readThreadsCpu(dir).sort((a, b) => a.name.localeCompare(b.name))).toEqual([
        { name: 'app', us: 1e6 },
        { name: 'tsnet-io0', us: 5e5 },
      ]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    expect(readThreadsCpu(path.join(dir, 'gone'))).toEqual([]);
  });

  it('reads this process: one entry per thread, the main thread among them', () => {
    const threads = readThreadsCpu();
    expect(threads.length).toBeGreaterThanOrEqual(1);
    const main = parseThreadStat(fs.readFileSync(`/proc/self/task/${process.pid}/stat`, 'latin1'));
    expect(threads.map((t) => t.name)).toContain(main?.name);
    for (const t of threads) expect(t.us).toBeGreaterThanOrEqual(0);
    // The whole process counts every thread, the ones that ended too.
    const whole = readProcessCpu();
    expect(whole).toBeGreaterThanOrEqual(Math.max(...threads.map((t) => t.us)));
    expect(readProcessCpu('/proc/self/no-such-file')).toBeUndefined();
  });

  it('sums tsnet\'s threads by kind and names the busiest three kinds of the rest', () => {
    const line = processCpuLine([
      { name: 'tsnet-io1', us: 2e6 },
      { name: 'all_reduce_perf', us: 9e6 },
      { name: 'tsnet-v8', us: 1e5 },
      { name: 'tsnet-plugin', us: 1.5e6 },
      { name: 'tsnet-io0', us: 1e6 },
      { name: 'NCCL Progress  0', us: 4e6 },
      { name: 'NCCL Progress  1', us: 3e6 },
      { name: 'cuda-EvtHandlr', us: 0 },
      { name: 'tsnet-proto1', us: 5e5 },
      { name: 'tsnet-v8', us: 2e5 },
      { name: 'all_reduce_perf', us: 1e6 },
      { name: 'NCCL Service  0', us: 1e4 },
      { name: 'tsnet-bench', us: 0 }, // the application's, though named tsnet-*
    ]);
    expect(line).toBe(
      'stats: process CPU by thread (user + system): tsnet 5.30 s (tsnet-plugin 1.50 s, tsnet-proto 0.50 s, tsnet-io 3.00 s (2), tsnet-v8 0.30 s (2)); ' +
        'the rest of the process 17.01 s in 7 thread(s) (all_reduce_perf 10.00 s (2), NCCL Progress 7.00 s (2), NCCL Service 0.01 s)',
    );
    expect(processCpuLine([{ name: 'tsnet-io0', us: 1e6 }], 2.5e6)).toBe(
      'stats: process CPU by thread (user + system): tsnet 1.00 s (tsnet-io 1.00 s); the rest of the process 0.00 s in 0 thread(s); ' +
        'the whole process 2.50 s, threads that have ended included',
    );
    expect(processCpuLine([{ name: 'app', us: 0 }])).toBe(
      'stats: process CPU by thread (user + system): tsnet 0.00 s (no threads); the rest of the process 0.00 s in 1 thread(s) (app 0.00 s)',
    );
  });
});

describe('connection set-up figures (TSNET_STATS)', () => {
  it('a time histogram puts each time in its power-of-two bucket, the longest ones in the last, and gives median, p99 and max', () => {
    const h = new TimeHistogram();
    expect(h.text()).toBe('-');
    for (const us of [0, 1.5, 3, 900, 1000, 1023, 1024, 70_000]) h.add(us);
    h.add(-5); // a clock read twice across threads never gives a negative bucket
    expect(h.count).toBe(9);
    expect(h.maxUs).toBe(70_000);
    expect(h.buckets[0]).toBe(3); // 0, 1.5 and the negative one, below 2 us
    expect(h.buckets[1]).toBe(1); // 3: below 4
    expect(h.buckets[9]).toBe(3); // 900, 1000 and 1023: below 1024
    expect(h.buckets[10]).toBe(1); // 1024: below 2048
    expect(h.buckets[16]).toBe(1); // 70 ms: below 131072 us
    expect(h.text()).toBe('median < 1024 us, p99 < 131072 us, max 70000 us');
    h.add(3600e6); // an hour
    expect(h.buckets[SETUP_BUCKETS - 1]).toBe(1);
    expect(h.text()).toBe(`median < 1024 us, p99 >= ${2 ** (SETUP_BUCKETS - 1)} us, max 3600000000 us`);
  });

  it('a thread reports its connects and accepts, their calls and the time in them; nothing without calls; no handshake part where the transport times none', () => {
    const s = newSetupStats();
    expect(setupStatsLines(3, s)).toEqual([]);
    s.connectCalls = 40;
    s.connectUs = 2500;
    s.connected.add(1500);
    s.connected.add(3000);
    s.acceptCalls = 7;
    s.acceptUs = 120;
    s.accepted = 2;
    expect(setupStatsLines(3, s)).toEqual([
      'stats: protocol thread 3: connects: 2 comm(s) up, first call to comm median < 2048 us, p99 < 4096 us, max 3000 us; 40 call(s), 2.5 ms in them',
      'stats: protocol thread 3: accepts: 2 comm(s) up; 7 call(s), 0.1 ms in them',
    ]);
    s.handshakes.add(300);
    s.handshakes.add(5000);
    s.waits.add(10);
    s.waits.add(40);
    s.connectHandshakes.add(700);
    s.connectWaits.add(2600);
    expect(setupStatsLines(3, s)).toEqual([
      'stats: protocol thread 3: connects: 2 comm(s) up, first call to comm median < 2048 us, p99 < 4096 us, max 3000 us; first call to ready median < 1024 us, p99 < 1024 us, max 700 us; ready to connected median < 4096 us, p99 < 4096 us, max 2600 us; 40 call(s), 2.5 ms in them',
      'stats: protocol thread 3: accepts: 2 comm(s) up; first message to ready median < 512 us, p99 < 8192 us, max 5000 us; ready to accepted median < 16 us, p99 < 64 us, max 40 us; 7 call(s), 0.1 ms in them',
    ]);
  });

  it('connects given before ready (TSNET_CONNECT_EARLY) are counted; their handshakes, once timed, join the others', () => {
    const s = newSetupStats();
    s.connectCalls = 2;
    s.connectUs = 900;
    s.connected.add(300);
    s.connected.add(400);
    s.connectEarly = 2;
    expect(setupStatsLines(0, s)).toEqual([
      'stats: protocol thread 0: connects: 2 comm(s) up, first call to comm median < 512 us, p99 < 512 us, max 400 us; 2 given before ready; 2 call(s), 0.9 ms in them',
    ]);
    s.connectHandshakes.add(1500);
    expect(setupStatsLines(0, s)).toEqual([
      'stats: protocol thread 0: connects: 2 comm(s) up, first call to comm median < 512 us, p99 < 512 us, max 400 us; first call to ready median < 2048 us, p99 < 2048 us, max 1500 us; ready to connected -; 2 given before ready; 2 call(s), 0.9 ms in them',
    ]);
  });
});

describe("V8's collections on a protocol thread (TSNET_STATS)", () => {
  it('counts full and young collections apart with their pauses, and leaves the other kinds out', () => {
    const g = new GcStats();
    g.add(perf.NODE_PERFORMANCE_GC_MAJOR, 4.25);
    g.add(perf.NODE_PERFORMANCE_GC_MAJOR, 1);
    g.add(perf.NODE_PERFORMANCE_GC_MINOR, 0.5);
    g.add(perf.NODE_PERFORMANCE_GC_INCREMENTAL, 3);
    g.add(perf.NODE_PERFORMANCE_GC_WEAKCB, 3);
    expect(g.counts).toEqual({ full: 2, fullMs: 5.25, young: 1, youngMs: 0.5 });
    expect(gcStatsLine(2, g.counts, { heapUsed: 5.5 * 1048576, heapTotal: 24 * 1048576, external: 73.25 * 1048576 })).toBe(
      'stats: protocol thread 2: V8 collections 2 full (5.3 ms), 1 young (0.5 ms); heap 5.5 of 24.0 MiB, external 73.3 MiB',
    );
  });

  it("once started, sees this thread's own collections", async () => {
    const g = new GcStats();
    g.start();
    const gc = (globalThis as { gc?: () => void }).gc;
    if (gc) gc();
    else for (let i = 0; i < 40; i++) new Array(1 << 16).fill({ i }); // young collections at least
    await new Promise((r) => setTimeout(r, 50));
    expect(g.counts.full + g.counts.young).toBeGreaterThan(0);
    if (gc) expect(g.counts.full).toBeGreaterThanOrEqual(1);
  });
});
