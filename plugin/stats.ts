// TSNET_STATS=1: what each comm and each protocol thread did, logged at INFO when a comm
// closes and when a context is finalized. Costs nothing when off (counters only).
import type { CommStats } from './protocol/endpoint';
import * as fs from 'node:fs';
import { PerformanceObserver, constants as perf } from 'node:perf_hooks';
import { monoMs } from './clock';

export interface ThreadStats {
  /** Requests NCCL posted to this thread. */
  requests: number;
  /** Thread CPU (µs) when the counting began. */
  cpuStart: number;
  /** Busy time (µs: turns and control calls) when the counting began. */
  busyStart: number;
  started: number;
}

const gb = (bytes: number) => (bytes / 1e9).toFixed(3);

export function commStatsLine(id: number, kind: string, s: CommStats, ms: number): string {
  return `stats: comm ${id} (${kind}): ${s.messages} messages, ${gb(s.bytes)} GB in ${(ms / 1000).toFixed(2)} s`;
}

/**
 * CPU counts the busy-poll window too (TSNET_SPIN_US); busy is the time spent in turns and
 * control calls: what a request really costs the thread.
 */
export function threadStatsLine(thread: number, s: ThreadStats, cpuNow: number, busyNow: number, sent?: { here: number; part: number }): string {
  const cpu = cpuNow - s.cpuStart;
  const busy = busyNow - s.busyStart;
  const per = (us: number) => (s.requests ? (us / s.requests).toFixed(2) : '-');
  // Since the thread's first engine use, warm-up included (TSNET_DIRECT_SEND_MAX).
  const here = sent ? `; sent by this thread itself ${sent.here} (in part ${sent.part})` : '';
  return (
    `stats: protocol thread ${thread}: ${s.requests} requests in ${((monoMs() - s.started) / 1000).toFixed(2)} s; ` +
    `CPU ${(cpu / 1e6).toFixed(3)} s (${per(cpu)} us per request), busy ${(busy / 1e6).toFixed(3)} s (${per(busy)} us per request)${here}`
  );
}

/** What a protocol thread had done, sampled at each watchdog tick (for holdLine). */
export interface HoldSample {
  /** Thread CPU, µs. */
  cpu: number;
  /** µs in turns and control calls. */
  busy: number;
  /** µs waited for a CPU while runnable; -1 where unknown. */
  wait: number;
  /** The longest turn or control call since the sample before (what: "turn" or the call's name). */
  longest?: { us: number; what: string | null };
}

/**
 * What the thread did while its event loop was held for heldMs between two samples, read from
 * its CPU, its time in tsnet's turns and calls (wall time: a call the thread sat in counts whole)
 * and its time waiting for a CPU: a host that gave it none; a call of tsnet's (by name) or code
 * outside tsnet's calls that ran all along; a call it sat in without running (a lock, a system
 * call, or the process stopped while inside it); or none of these. The watchdog's WARN ends with it.
 */
export function holdLine(heldMs: number, a: HoldSample, b: HoldSample): string {
  const ms = (us: number) => Math.round(us / 1000);
  const cpu = ms(b.cpu - a.cpu);
  const busy = ms(b.busy - a.busy);
  const wait = a.wait >= 0 && b.wait >= 0 ? ms(b.wait - a.wait) : -1;
  const long = b.longest && b.longest.what ? b.longest : undefined;
  const parts = [`meanwhile the thread used ${cpu} ms of CPU`, `${busy} ms in tsnet's turns and calls${long ? ` (the longest: ${long.what}, ${ms(long.us)} ms)` : ''}`];
  if (wait >= 0) parts.push(`and waited ${wait} ms for a CPU`);
  const half = heldMs / 2;
  const oneCall = long && ms(long.us) >= half ? long.what : undefined;
  let why: string;
  if (wait >= half) why = 'the host gave it no CPU';
  else if (cpu >= half && busy >= half) why = oneCall ? `its call ${oneCall} held it, running` : "tsnet's own work held it, running";
  else if (cpu >= half) why = "code outside tsnet's calls held it, running";
  else if (oneCall) why = `it sat in its call ${oneCall}, neither running nor waiting for a CPU: blocked (a lock, a system call), or the process was stopped`;
  else why = 'it neither ran nor waited for a CPU: blocked (a lock, a system call), not woken, or the process was stopped';
  return `${parts.join(', ')}: ${why}`;
}

/** WakeDelays::kBuckets (native/wake_delays.h): the last bucket holds every longer delay. */
export const WAKE_BUCKETS = 16;

/** How late a sleeping thread woke when another asked it to (native/wake_delays.h). */
export interface WakeDelays {
  /** Wake-ups taken. */
  count: number;
  sumUs: number;
  maxUs: number;
  /** Bucket k: delays below 2^(k+1) µs (bucket 0: below 2 µs); the last bucket, the rest. */
  buckets: number[];
}

/** The buckets of several threads' delays added up. */
export function sumBuckets(all: WakeDelays[]): number[] {
  return Array.from({ length: WAKE_BUCKETS }, (_, k) => all.reduce((a, w) => a + (w.buckets[k] ?? 0), 0));
}

/** The bucket that holds the q-quantile of the counts (q in (0, 1]); -1 when there are none. */
export function quantileBucket(buckets: ArrayLike<number>, q: number): number {
  let total = 0;
  for (let k = 0; k < buckets.length; k++) total += buckets[k];
  let seen = 0;
  for (let k = 0; k < buckets.length; k++) {
    seen += buckets[k];
    if (total > 0 && seen >= q * total) return k;
  }
  return -1;
}

/** The q-quantile as the bound of its bucket (bucket k: below 2^(k+1) µs; the last: at least 2^k). */
function quantileBound(buckets: ArrayLike<number>, q: number): string {
  const k = quantileBucket(buckets, q);
  if (k < 0) return '-';
  return k >= buckets.length - 1 ? `>= ${2 ** k} us` : `< ${2 ** (k + 1)} us`;
}

/**
 * How late the threads named by `who` took wake-ups, all of theirs together: a host whose
 * sleeping threads wake late (docs/performance.md) shows it here, where a trace would
 * change the timing. The figures count since the process started.
 */
export function wakeStatsLine(who: string, all: WakeDelays[]): string {
  const count = all.reduce((a, w) => a + w.count, 0);
  if (!count) return `stats: wake-ups of ${who}: none`;
  const buckets = sumBuckets(all);
  const sum = all.reduce((a, w) => a + w.sumUs, 0);
  const max = Math.max(...all.map((w) => w.maxUs));
  return (
    `stats: wake-ups of ${who}: ${count}, mean ${(sum / count).toFixed(1)} us, median ${quantileBound(buckets, 0.5)}, ` +
    `p99 ${quantileBound(buckets, 0.99)}, max ${max.toFixed(0)} us`
  );
}

/** One thread of the process and the CPU it has used (user + system) since it started. */
export interface ThreadCpu {
  name: string;
  us: number;
}

/** USER_HZ, the unit of /proc's utime and stime: 100 on every Linux architecture NCCL runs on. */
const USER_HZ = 100;

/**
 * Every thread of this process with its CPU, from /proc/self/task/<tid>/stat (a thread that
 * ends while it is read is left out); [] where /proc cannot be read.
 */
export function readThreadsCpu(dir = '/proc/self/task'): ThreadCpu[] {
  let tids: string[];
  try {
    tids = fs.readdirSync(dir);
  } catch {
    return [];
  }
  const out: ThreadCpu[] = [];
  for (const tid of tids) {
    let text: string;
    try {
      text = fs.readFileSync(`${dir}/${tid}/stat`, 'latin1');
    } catch {
      continue;
    }
    const t = parseThreadStat(text);
    if (t) out.push(t);
  }
  return out;
}

/** The CPU of the whole process, threads that have ended included (/proc/self/stat); undefined where it cannot be read. */
export function readProcessCpu(file = '/proc/self/stat'): number | undefined {
  try {
    return parseThreadStat(fs.readFileSync(file, 'latin1'))?.us;
  } catch {
    return undefined;
  }
}

/** A /proc/<pid>/task/<tid>/stat line: name and utime + stime; undefined if it is not one. */
export function parseThreadStat(text: string): ThreadCpu | undefined {
  // "tid (comm) state ppid ...": the name may hold spaces and parentheses, so it ends at the last ')'.
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) return undefined;
  const f = text.slice(close + 2).trim().split(/\s+/);
  // Fields 14 and 15 of proc(5), counted from the state (field 3) at index 0.
  const ticks = Number(f[11]) + Number(f[12]);
  if (!Number.isFinite(ticks)) return undefined;
  return { name: text.slice(open + 1, close), us: (ticks * 1e6) / USER_HZ };
}

/** A thread's name without its number: tsnet-io3 → tsnet-io, "NCCL Progress  2" → NCCL Progress. */
const family = (name: string) => name.replace(/^(tsnet-(?:io|proto))\d+$/, '$1').replace(/\s+\d+$/, '') || name;

/** The kinds of thread tsnet starts, in the order the line gives them; any other name is the host's. */
const OURS = ['tsnet-plugin', 'tsnet-proto', 'tsnet-io', 'tsnet-v8'];

/**
 * TSNET_STATS: where the process's CPU went, by thread: tsnet's threads by kind (tsnet-plugin,
 * tsnet-proto, tsnet-io, tsnet-v8: Node's platform), then the rest of the process (the
 * application, NCCL, CUDA) with its three busiest kinds, so that what tsnet costs a job is
 * seen next to what the job's own threads use. Counts since each thread started; the whole
 * process's figure also counts the threads that have ended (NCCL's, once its comms are gone).
 */
export function processCpuLine(threads: ThreadCpu[], processUs?: number): string {
  const groups = new Map<string, { us: number; n: number }>();
  for (const t of threads) {
    const key = family(t.name);
    const g = groups.get(key) ?? { us: 0, n: 0 };
    g.us += t.us;
    g.n++;
    groups.set(key, g);
  }
  const s = (us: number) => `${(us / 1e6).toFixed(2)} s`;
  const item = (name: string, g: { us: number; n: number }) => `${name} ${s(g.us)}${g.n > 1 ? ` (${g.n})` : ''}`;
  // An application may call its own threads tsnet-something (the loopback benchmark's are
  // tsnet-bench): only the kinds tsnet starts count as tsnet's.
  const ours = [...groups].filter(([k]) => OURS.includes(k)).sort((a, b) => OURS.indexOf(a[0]) - OURS.indexOf(b[0]));
  const rest = [...groups].filter(([k]) => !OURS.includes(k)).sort((a, b) => b[1].us - a[1].us);
  const total = (gs: typeof ours) => gs.reduce((a, [, g]) => a + g.us, 0);
  const count = (gs: typeof ours) => gs.reduce((a, [, g]) => a + g.n, 0);
  const busiest = rest.slice(0, 3).map(([k, g]) => item(k, g)).join(', ');
  return (
    `stats: process CPU by thread (user + system): tsnet ${s(total(ours))} (${ours.map(([k, g]) => item(k, g)).join(', ') || 'no threads'}); ` +
    `the rest of the process ${s(total(rest))} in ${count(rest)} thread(s)${busiest ? ` (${busiest})` : ''}` +
    (processUs === undefined ? '' : `; the whole process ${s(processUs)}, threads that have ended included`)
  );
}

/** Buckets of a TimeHistogram: bucket k holds times below 2^(k+1) µs, the last one the rest (from about 8 s). */
export const SETUP_BUCKETS = 24;

/** µs as ms with one decimal (set-up lines). */
const msText = (us: number) => (us / 1000).toFixed(1);

/** Times in µs by powers of two (connection set-up, TSNET_STATS). */
export class TimeHistogram {
  count = 0;
  maxUs = 0;
  readonly buckets: number[] = new Array(SETUP_BUCKETS).fill(0);

  add(us: number): void {
    const v = Math.max(0, us);
    this.count++;
    if (v > this.maxUs) this.maxUs = v;
    const k = v < 2 ? 0 : Math.floor(Math.log2(v));
    this.buckets[Math.min(k, SETUP_BUCKETS - 1)]++;
  }

  /** "median < X us, p99 < Y us, max Z us", or "-" when empty. */
  text(): string {
    if (!this.count) return '-';
    return `median ${quantileBound(this.buckets, 0.5)}, p99 ${quantileBound(this.buckets, 0.99)}, max ${this.maxUs.toFixed(0)} us`;
  }
}

/**
 * What setting comms up cost a protocol thread: NCCL calls connect and accept again until
 * the comm is up (3 to 9 times per comm, milliseconds apart, under NCCL 2.28 with PyTorch:
 * docs/performance.md, item 42), and each call is a control call on this thread.
 */
export interface SetupStats {
  /** Comms connected: from the first connect call of their handle to the call that gave the comm. */
  connected: TimeHistogram;
  /** ... where the transport times them: from that first call to ready, and from ready to the call that took it. */
  connectHandshakes: TimeHistogram;
  connectWaits: TimeHistogram;
  /** Comms given before ready (TSNET_CONNECT_EARLY): in connectHandshakes once ready, never in connectWaits. */
  connectEarly: number;
  /** connect calls, and the µs spent in them. */
  connectCalls: number;
  connectUs: number;
  /** Comms accepted where the transport says: from the connection's first message (TCP: greeting; libfabric: CONNECT) to ready for accept. */
  handshakes: TimeHistogram;
  /** ... and from ready to the accept call that took it. */
  waits: TimeHistogram;
  accepted: number;
  acceptCalls: number;
  acceptUs: number;
}

export function newSetupStats(): SetupStats {
  return { connected: new TimeHistogram(), connectHandshakes: new TimeHistogram(), connectWaits: new TimeHistogram(), connectEarly: 0, connectCalls: 0, connectUs: 0, handshakes: new TimeHistogram(), waits: new TimeHistogram(), accepted: 0, acceptCalls: 0, acceptUs: 0 };
}

/** The lines of a thread's set-up figures (none when it had neither connect nor accept calls). */
export function setupStatsLines(thread: number, s: SetupStats): string[] {
  const out: string[] = [];
  if (s.connectCalls) {
    const early = s.connectEarly ? `; ${s.connectEarly} given before ready` : '';
    const parts = s.connectHandshakes.count ? `; first call to ready ${s.connectHandshakes.text()}; ready to connected ${s.connectWaits.text()}${early}` : early;
    out.push(
      `stats: protocol thread ${thread}: connects: ${s.connected.count} comm(s) up, first call to comm ${s.connected.text()}${parts}; ` +
        `${s.connectCalls} call(s), ${msText(s.connectUs)} ms in them`,
    );
  }
  if (s.acceptCalls) {
    const parts = s.handshakes.count ? `; first message to ready ${s.handshakes.text()}; ready to accepted ${s.waits.text()}` : '';
    out.push(`stats: protocol thread ${thread}: accepts: ${s.accepted} comm(s) up${parts}; ${s.acceptCalls} call(s), ${msText(s.acceptUs)} ms in them`);
  }
  return out;
}

/** A protocol thread's control calls of one name, as NCCL's threads waited for them (embed/host.h). */
export interface ControlCallStats {
  call: string;
  count: number;
  /** µs the callers waited in all: the hand-over, the queue behind other calls and turns, the call, the way back. */
  waitedUs: number;
  /** µs the thread ran them. */
  ranUs: number;
  maxWaitedUs: number;
}

/**
 * One line of a thread's control calls, the longest waits first: where NCCL's threads waited
 * for tsnet outside its posted requests (connects, accepts, listens, registrations, closes).
 */
export function controlCallsLine(thread: number, calls: readonly ControlCallStats[]): string {
  const parts = [...calls]
    .sort((a, b) => b.waitedUs - a.waitedUs || a.call.localeCompare(b.call))
    .map((c) => `${c.call} ${c.count}, waited ${msText(c.waitedUs)} ms (ran ${msText(c.ranUs)}, longest ${msText(c.maxWaitedUs)})`);
  return `stats: protocol thread ${thread}: control calls as NCCL's threads waited for them: ${parts.join('; ')}`;
}

/** V8's collections on one protocol thread, by kind: how many, and their pauses in ms. */
export interface GcCounts {
  full: number;
  fullMs: number;
  young: number;
  youngMs: number;
}

/**
 * Counts V8's collections on this thread from when it starts (TSNET_STATS): full ones are what
 * external memory V8 counts makes it run (docs/performance.md, item 45); the pauses are V8's
 * own figures, incremental marking steps not included.
 */
export class GcStats {
  readonly counts: GcCounts = { full: 0, fullMs: 0, young: 0, youngMs: 0 };
  private observer: PerformanceObserver | undefined;

  start(): void {
    if (this.observer) return;
    this.observer = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) this.add((e.detail as { kind?: number } | undefined)?.kind ?? 0, e.duration);
    });
    this.observer.observe({ entryTypes: ['gc'] });
  }

  add(kind: number, ms: number): void {
    if (kind === perf.NODE_PERFORMANCE_GC_MAJOR) {
      this.counts.full++;
      this.counts.fullMs += ms;
    } else if (kind === perf.NODE_PERFORMANCE_GC_MINOR) {
      this.counts.young++;
      this.counts.youngMs += ms;
    }
  }
}

/** What a protocol thread's isolate holds: V8's heap, and the memory outside it that V8 counts (ArrayBuffers'). */
export interface HeapFigures {
  heapUsed: number;
  heapTotal: number;
  external: number;
}

const mib = (bytes: number) => (bytes / 1048576).toFixed(1);

export function gcStatsLine(thread: number, g: GcCounts, h: HeapFigures): string {
  return (
    `stats: protocol thread ${thread}: V8 collections ${g.full} full (${g.fullMs.toFixed(1)} ms), ${g.young} young (${g.youngMs.toFixed(1)} ms); ` +
    `heap ${mib(h.heapUsed)} of ${mib(h.heapTotal)} MiB, external ${mib(h.external)} MiB`
  );
}
