// Builds the C bench binary (bench/bench.c + the driver's per-version shim) and runs one
// measurement of it: one process pair, one JSON line back.
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const BENCH_BIN = 'build/bench/tsnet-bench';
const SOURCES = ['bench/bench.c', 'test/driver/shim.c', 'test/driver/shim.h', 'native/generated/tsnet_abi.h'];

/** Compiles build/bench/tsnet-bench when it is missing or older than a source; returns the command used, or null. */
export function buildBench(root: string): string | null {
  const bin = path.join(root, BENCH_BIN);
  const built = fs.existsSync(bin) ? fs.statSync(bin).mtimeMs : -1;
  const stale = SOURCES.some((s) => fs.statSync(path.join(root, s)).mtimeMs > built);
  if (!stale) return null;
  fs.mkdirSync(path.dirname(bin), { recursive: true });
  const cc = process.env.CC || 'cc';
  const args = ['-std=c11', '-O2', '-Wall', '-Wextra', '-I', 'native/generated', '-I', 'test/driver',
    'bench/bench.c', 'test/driver/shim.c', '-o', BENCH_BIN, '-ldl', '-lpthread'];
  execFileSync(cc, args, { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  return [cc, ...args].join(' ');
}

export type Mode = 'tsnet-lat' | 'tsnet-bw' | 'tcp-lat' | 'tcp-bw';

/** Which table a measurement belongs to: latency and bandwidth (tsnet over its TCP transport
 * and plain TCP), the libfabric series, or the message rate. */
export type Phase = 'latbw' | 'ofi' | 'rate';

/** What carried the traffic: tsnet over its TCP transport, tsnet over libfabric's tcp or shm
 * provider (TSNET_TRANSPORT=ofi), or plain C TCP sockets. */
export type Series = 'tsnet' | 'ofi-tcp' | 'ofi-shm' | 'tcp';

/** The tsnet figures' set-up: seconds to load and init the plugin, and to connect every comm. */
export interface SetupSeconds {
  init: number;
  connect: number;
}

export interface LatLine {
  mode: 'tsnet-lat' | 'tcp-lat';
  size: number;
  iterations: number;
  seconds: number;
  lat_us: { median: number; p99: number; min: number; max: number; mean: number };
  setup_s?: SetupSeconds; // tsnet only
}

/** CPU µs per message of the sender's and the receiver's protocol and I/O threads (tsnet only). */
export interface CpuLine {
  send_proto: number;
  send_io: number;
  recv_proto: number;
  recv_io: number;
}

export interface BwLine {
  mode: 'tsnet-bw' | 'tcp-bw';
  size: number;
  streams: number | null;
  messages: number;
  bytes: number;
  seconds: number;
  bw_GBps: number;
  inflight?: number;
  pairs?: number;
  msgs_per_s?: number;
  cpu_us_per_msg?: CpuLine; // tsnet only
  setup_s?: SetupSeconds; // tsnet only
}

export type Line = LatLine | BwLine;

export interface Measurement {
  phase: Phase;
  series: Series;
  mode: Mode;
  size: number;
  streams: number | null; // tcp-bw's sockets; null for tsnet (TSNET_NSOCKS) and tcp-lat (1)
  pairs: number; // tsnet's comm pairs; plain TCP's sockets (a socket is TCP's comm pair)
  inflight: number; // per comm (tsnet) or the receiver's buffer ring (tcp-bw); 1 for ping-pong
  env: Record<string, string>; // what this series sets on top of the common environment
  args: string[];
  result?: Line;
  error?: string;
  shmLeft?: string[]; // libfabric shm regions the processes left in /dev/shm (bench.c removed them)
  warnings?: string[]; // the plugin's WARN lines ("[A|B pid] WARN ...")
  wallSeconds: number;
}

export interface RunSpec {
  root: string;
  phase: Phase;
  series: Series;
  mode: Mode;
  size: number;
  streams: number;
  pairs: number; // tsnet-bw's --pairs
  inflight: number; // *-bw's --inflight
  duration: number;
  warmup: number;
  version: number;
  timeout: number;
  lib: string;
  env: NodeJS.ProcessEnv;
  seriesEnv: Record<string, string>; // recorded with the measurement (already part of env)
}

/** Runs one measurement; never throws: a failure comes back as `error` (the bench's stderr tail). */
export function runOne(s: RunSpec): Promise<Measurement> {
  const args = [s.mode, '--size', String(s.size), '--duration', String(s.duration), '--warmup', String(s.warmup),
    '--version', String(s.version), '--timeout', String(s.timeout), '--lib', s.lib];
  const bw = s.mode.endsWith('-bw');
  if (s.mode === 'tcp-bw') args.push('--streams', String(s.streams));
  if (s.mode === 'tsnet-bw') args.push('--pairs', String(s.pairs));
  if (bw) args.push('--inflight', String(s.inflight));
  const m: Measurement = {
    phase: s.phase,
    series: s.series,
    mode: s.mode,
    size: s.size,
    streams: s.mode === 'tcp-bw' ? s.streams : null,
    pairs: s.mode === 'tcp-bw' ? s.streams : s.mode === 'tsnet-bw' ? s.pairs : 1,
    inflight: bw ? s.inflight : 1,
    env: s.seriesEnv,
    args,
    wallSeconds: 0,
  };
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(path.join(s.root, BENCH_BIN), args, { cwd: s.root, env: s.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    // The binary bounds every wait itself; this is the backstop.
    const limit = (s.warmup + s.duration + 4 * s.timeout + 15) * 1000;
    const timer = setTimeout(() => child.kill('SIGKILL'), limit);
    let finished = false;
    const finish = (why?: string) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      m.wallSeconds = (Date.now() - started) / 1000;
      const line = out.split('\n').filter((l) => l.startsWith('{')).pop();
      if (!why && line) {
        try {
          m.result = JSON.parse(line) as Line;
        } catch {
          why = `unreadable output: ${line}`;
        }
      } else if (!why) why = 'no result line';
      const left = [...err.matchAll(/libfabric's shm region (\S+) was left behind/g)].map((x) => x[1]);
      if (left.length) m.shmLeft = left;
      const warnings = err.split('\n').filter((l) => /^\[\S+ \d+\] WARN /.test(l));
      if (warnings.length) m.warnings = warnings;
      // The reasons, not the JS stack frames under them.
      const lines = err.split('\n').filter((l) => l.trim() !== '' && !/^\s+at /.test(l));
      if (why) m.error = `${why}${lines.length ? `: ${lines.slice(-4).join(' | ')}` : ''}`;
      resolve(m);
    };
    child.on('error', (e) => finish(`cannot start ${BENCH_BIN}: ${e.message}`));
    child.on('close', (code, signal) => finish(code === 0 ? undefined : `exit ${code ?? signal}`));
  });
}
