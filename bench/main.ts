// The loopback benchmark (`npm start`): tsnet through build/libnccl-net-tsnet.so against plain
// C TCP sockets, interleaved per size and repeat; a table, bench.json and bench.svg.
// See docs/benchmark.md.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describeMachine } from './machine';
import { formatSize, parseOptions, USAGE, type Options } from './options';
import { renderSvg, seriesNames } from './plot';
import { aggregate, table, TARGETS, verdict } from './report';
import { buildBench, runOne, type Measurement, type Mode } from './run';

const ROOT = path.resolve(__dirname, '..', '..');

interface Job {
  mode: Mode;
  streams: number;
  label: string;
}

/** One round at one size: tsnet and the baselines back to back, so noise hits all alike. */
function round(streams: number): Job[] {
  const jobs: Job[] = [
    { mode: 'tsnet-lat', streams, label: 'tsnet latency' },
    { mode: 'tcp-lat', streams: 1, label: 'tcp latency' },
    { mode: 'tsnet-bw', streams, label: 'tsnet bandwidth' },
    { mode: 'tcp-bw', streams: 1, label: 'tcp-1 bandwidth' },
  ];
  if (streams !== 1) jobs.push({ mode: 'tcp-bw', streams, label: `tcp-${streams} bandwidth` });
  return jobs;
}

/** The progress line: rewritten in place on a terminal, one line per step otherwise. */
class Progress {
  private readonly tty = Boolean(process.stderr.isTTY);
  private width = 0;
  show(text: string): void {
    if (this.tty) {
      const cols = process.stderr.columns || 120;
      const t = text.length >= cols ? `${text.slice(0, cols - 2)}…` : text;
      process.stderr.write(`\r${t.padEnd(this.width)}`);
      this.width = t.length;
    } else {
      process.stderr.write(`${text}\n`);
    }
  }
  done(): void {
    if (this.tty && this.width) process.stderr.write(`\r${' '.repeat(this.width)}\r`);
    this.width = 0;
  }
}

function eta(seconds: number): string {
  return seconds < 120 ? `${Math.ceil(seconds)} s` : `${Math.ceil(seconds / 60)} min`;
}

function summary(m: Measurement): string {
  if (m.error) return `FAILED: ${m.error}`;
  const r = m.result!;
  if ('lat_us' in r) return `${r.lat_us.median.toFixed(1)} µs median, ${r.lat_us.p99.toFixed(1)} µs p99`;
  return `${r.bw_GBps.toFixed(3)} GB/s`;
}

async function main(): Promise<number> {
  let o: Options;
  try {
    const parsed = parseOptions(process.argv.slice(2), process.env);
    if (parsed === 'help') {
      process.stdout.write(USAGE);
      return 0;
    }
    o = parsed;
  } catch (e) {
    process.stderr.write(`bench: ${(e as Error).message}\n${USAGE}`);
    return 2;
  }
  const lib = path.resolve(ROOT, o.lib);
  if (!fs.existsSync(lib)) {
    process.stderr.write(`bench: ${lib} does not exist: run npm run build first\n`);
    return 1;
  }
  try {
    const built = buildBench(ROOT);
    if (built) process.stderr.write(`bench: built ${built.split(' -o ')[1].split(' ')[0]}\n`);
  } catch (e) {
    process.stderr.write(`bench: cannot build the bench binary: ${(e as Error).message}\n`);
    return 1;
  }

  // tsnet over loopback: TCP transport on 127.0.0.1 (its devices skip lo unless asked for it).
  const tsnetEnv: NodeJS.ProcessEnv = {
    ...process.env,
    TSNET_TRANSPORT: process.env.TSNET_TRANSPORT ?? 'tcp',
    NCCL_SOCKET_IFNAME: process.env.NCCL_SOCKET_IFNAME ?? 'lo',
    TSNET_NSOCKS: String(o.streams),
  };
  const machine = describeMachine(ROOT, tsnetEnv);
  const jobs = round(o.streams);
  const total = o.sizes.length * o.repeats * jobs.length;
  const progress = new Progress();
  const started = new Date();
  const ms: Measurement[] = [];
  process.stderr.write(
    `bench: tsnet (v${o.version} table, ${o.streams} data sockets) vs plain TCP over loopback; ` +
      `${o.sizes.length} sizes x ${o.repeats} repeats x ${jobs.length} series, ${o.duration} s each ` +
      `(about ${eta(total * (o.duration + o.warmup + 0.5))}) on ${machine.cores} cores\n`,
  );
  let k = 0;
  for (const size of o.sizes) {
    for (let r = 0; r < o.repeats; r++) {
      for (const j of jobs) {
        k++;
        const where = `[${k}/${total}] ${formatSize(size)} repeat ${r + 1}/${o.repeats} ${j.label}`;
        progress.show(`${where} ...`);
        const m = await runOne({
          root: ROOT, mode: j.mode, size, streams: j.streams, duration: o.duration, warmup: o.warmup,
          version: o.version, timeout: o.timeout, lib, env: j.mode.startsWith('tsnet') ? tsnetEnv : process.env,
        });
        ms.push(m);
        progress.show(`${where}: ${summary(m)}`);
        if (m.error) {
          progress.done();
          process.stderr.write(`bench: ${where}: ${m.error}\n`);
        }
      }
    }
  }
  progress.done();
  const finished = new Date();

  const points = aggregate(o.sizes, ms, o.streams);
  const v = verdict(points);
  const failures = ms.filter((m) => m.error);
  const out = path.resolve(process.cwd(), o.out);
  fs.mkdirSync(out, { recursive: true });
  const names = seriesNames(o.streams);
  const json = {
    schema: 'tsnet-bench/1',
    started: started.toISOString(),
    finished: finished.toISOString(),
    options: { ...o, lib },
    machine,
    method: {
      latency: 'ping-pong, one message each way; one-way latency = RTT / 2 per iteration; median and p99 per run',
      bandwidth: '8 messages in flight (tsnet); TCP streams continuously, stripes as tsnet cuts them; bytes received / s in the window',
      spread: 'median over the repeats, min and max of the repeats',
      interleaving: 'per size and repeat: tsnet-lat, tcp-lat, tsnet-bw, tcp-bw 1 stream, tcp-bw N streams',
      series: names,
    },
    targets: TARGETS,
    verdict: v,
    points,
    failures: failures.length,
    runs: ms,
  };
  const jsonPath = path.join(out, 'bench.json');
  const svgPath = path.join(out, 'bench.svg');
  fs.writeFileSync(jsonPath, `${JSON.stringify(json, null, 2)}\n`);
  const subtitle =
    `${machine.cpuModel}, ${machine.cores} cores, ${machine.os}, Linux ${machine.kernel}; tsnet ${machine.tsnetCommit.slice(0, 12)}; ` +
    `medians of ${o.repeats} repeat(s), ${o.duration} s each`;
  fs.writeFileSync(svgPath, renderSvg(points, { title: 'tsnet vs plain TCP over loopback', subtitle, streams: o.streams }));

  const rel = (p: string) => (path.relative(process.cwd(), p).startsWith('..') ? p : path.relative(process.cwd(), p));
  process.stdout.write(
    `\ntsnet vs plain TCP over loopback (${machine.cores} cores, ${machine.cpuModel}); ` +
      `latency in µs (one-way), bandwidth in GB/s; median (min-max) of ${o.repeats} repeat(s)\n\n` +
      `${table(points, o.streams)}\n\n` +
      `lat x = tsnet / TCP median latency; bw x = tsnet / TCP with ${o.streams} streams\n` +
      `target bandwidth: ${v.bandwidth.text}\n` +
      `target latency:   ${v.latency.text}\n` +
      (failures.length ? `${failures.length} measurement(s) FAILED (see runs[].error in bench.json)\n` : '') +
      `wrote ${rel(jsonPath)} and ${rel(svgPath)}\n`,
  );
  return failures.length ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    process.stderr.write(`bench: ${(e as Error).stack ?? String(e)}\n`);
    process.exit(1);
  },
);
