// The loopback benchmark (`npm start`): tsnet through build/libnccl-net-tsnet.so against plain
// C TCP sockets, interleaved per size and repeat, over tsnet's TCP transport and over libfabric
// (TSNET_TRANSPORT=ofi with the tcp and shm providers); then the message rate. Tables,
// bench.json, bench.svg and bench-rate.svg. See docs/benchmark.md.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { findLibfabric, type Libfabric } from './libfabric';
import { describeMachine } from './machine';
import { BW_INFLIGHT, formatSize, parseOptions, USAGE, type OfiProvider, type Options } from './options';
import { renderRateSvg, renderSvg, seriesNames } from './plot';
import { aggregate, aggregateOfi, aggregateRate, ofiTable, rateTable, table, TARGETS, verdict } from './report';
import { buildBench, runOne, type Measurement, type Mode, type Phase, type Series } from './run';

const ROOT = path.resolve(__dirname, '..', '..');

interface Job {
  phase: Phase;
  series: Series;
  mode: Mode;
  size: number;
  streams: number; // tcp-bw's sockets
  pairs: number; // tsnet-bw's comm pairs
  inflight: number;
  label: string;
}

function job(phase: Phase, series: Series, mode: Mode, size: number, label: string, more: Partial<Job> = {}): Job {
  return { phase, series, mode, size, streams: 1, pairs: 1, inflight: BW_INFLIGHT, label, ...more };
}

/** One round at one size: tsnet, the baselines and tsnet over each libfabric provider back to
 * back, so noise hits all alike. */
function round(size: number, streams: number, ofi: OfiProvider[]): Job[] {
  const jobs: Job[] = [
    job('latbw', 'tsnet', 'tsnet-lat', size, 'tsnet latency'),
    job('latbw', 'tcp', 'tcp-lat', size, 'tcp latency'),
    job('latbw', 'tsnet', 'tsnet-bw', size, 'tsnet bandwidth'),
    job('latbw', 'tcp', 'tcp-bw', size, 'tcp-1 bandwidth'),
  ];
  if (streams !== 1) jobs.push(job('latbw', 'tcp', 'tcp-bw', size, `tcp-${streams} bandwidth`, { streams }));
  for (const p of ofi) {
    jobs.push(job('ofi', `ofi-${p}`, 'tsnet-lat', size, `ofi ${p} latency`));
    jobs.push(job('ofi', `ofi-${p}`, 'tsnet-bw', size, `ofi ${p} bandwidth`));
  }
  return jobs;
}

/** One round of the message rate at one size: tsnet and plain TCP over each number of pairs. */
function rateRound(size: number, pairs: number[], inflight: number): Job[] {
  return pairs.flatMap((n) => [
    job('rate', 'tsnet', 'tsnet-bw', size, `rate, ${n} pair(s), tsnet`, { pairs: n, inflight }),
    job('rate', 'tcp', 'tcp-bw', size, `rate, ${n} stream(s), tcp`, { streams: n, pairs: n, inflight }),
  ]);
}

/** Seconds a measurement takes beyond --warmup and --duration on the 2-core development
 * machine, until seen (then: what this run's took). Starting the plugin's Node costs about
 * 0.4 s a process; connecting over libfabric about 1 s more (docs/benchmark.md). */
const SETUP_GUESS: Record<'tcp' | 'tsnet' | 'ofi', number> = { tcp: 0.1, tsnet: 0.5, ofi: 1.8 };
function kind(j: Job): keyof typeof SETUP_GUESS {
  return j.series === 'tcp' ? 'tcp' : j.series === 'tsnet' ? 'tsnet' : 'ofi';
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
  if (m.phase === 'rate' && r.msgs_per_s !== undefined) return `${Math.round(r.msgs_per_s)} msgs/s`;
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

  // libfabric: the ofi series need it; by default they are skipped, saying why, without it.
  let libfabric: Libfabric | null = null;
  let ofiSkipped: string | null = null;
  if (o.ofi.length) {
    const f = findLibfabric(process.env);
    if ('found' in f) libfabric = f.found;
    else if (o.ofiExplicit) {
      process.stderr.write(`bench: --ofi ${o.ofi.join(',')}: ${f.why}\n`);
      return 2;
    } else {
      ofiSkipped = f.why;
      o.ofi = [];
    }
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
    // Every measurement has its own warm-up (--warmup) and measures the steady state, so the
    // plugin's warm-up at init would only lengthen the run (about 1 s per process on 2 cores).
    TSNET_WARMUP: process.env.TSNET_WARMUP ?? '0',
  };
  // tsnet over libfabric: the same, with the ofi transport, one provider, the library found.
  const ofiSet = (p: OfiProvider): Record<string, string> => ({
    TSNET_TRANSPORT: 'ofi',
    FI_PROVIDER: p,
    TSNET_LIBFABRIC: libfabric?.path ?? '',
  });
  const envOf = (series: Series): { env: NodeJS.ProcessEnv; set: Record<string, string> } => {
    if (series === 'tcp') return { env: process.env, set: {} };
    if (series === 'tsnet') return { env: tsnetEnv, set: { TSNET_TRANSPORT: tsnetEnv.TSNET_TRANSPORT as string } };
    const set = ofiSet(series === 'ofi-tcp' ? 'tcp' : 'shm');
    return { env: { ...tsnetEnv, ...set }, set };
  };
  const machine = describeMachine(ROOT, tsnetEnv);
  // The busy-poll window the plugin's threads use (docs/configuration.md): its CPU counts too.
  const spinUs = process.env.TSNET_SPIN_US !== undefined ? Number(process.env.TSNET_SPIN_US) : machine.cores >= 8 ? 200 : 0;

  const jobs: { job: Job; repeat: number }[] = [];
  for (const size of o.sizes)
    for (let r = 0; r < o.repeats; r++) for (const j of round(size, o.streams, o.ofi)) jobs.push({ job: j, repeat: r });
  for (const size of o.rateSizes)
    for (let r = 0; r < o.repeats; r++) for (const j of rateRound(size, o.ratePairs, o.inflight)) jobs.push({ job: j, repeat: r });
  const total = jobs.length;
  // Time left: per kind of series, what the finished ones took beyond warm-up and duration.
  const seen: Record<string, number[]> = { tcp: [], tsnet: [], ofi: [] };
  const extra = (j: Job) => {
    const v = seen[kind(j)];
    return v.length ? v.reduce((a, b) => a + b, 0) / v.length : SETUP_GUESS[kind(j)];
  };
  const left = (from: number) => jobs.slice(from).reduce((t, x) => t + o.duration + o.warmup + extra(x.job), 0);
  const progress = new Progress();
  const started = new Date();
  const ms: Measurement[] = [];
  if (ofiSkipped) process.stderr.write(`bench: the libfabric series are skipped: ${ofiSkipped}\n`);
  else if (libfabric) process.stderr.write(`bench: libfabric: ${libfabric.path} (found by ${libfabric.foundBy}); providers ${o.ofi.join(', ')}\n`);
  const seriesCount = round(8, o.streams, o.ofi).length;
  process.stderr.write(
    `bench: tsnet (v${o.version} table, ${o.streams} data sockets) vs plain TCP over loopback; ` +
      `${o.sizes.length} sizes x ${o.repeats} repeats x ${seriesCount} series` +
      (o.rateSizes.length ? `, then message rate: ${o.rateSizes.length} sizes x ${o.ratePairs.length} pair counts x ${o.repeats} repeats x 2 series` : '') +
      `; ${total} measurements of ${o.duration} s (about ${eta(left(0))}) on ${machine.cores} cores\n`,
  );
  for (let k = 0; k < total; k++) {
    const { job: j, repeat } = jobs[k];
    const where = `[${k + 1}/${total}] ${formatSize(j.size)} repeat ${repeat + 1}/${o.repeats} ${j.label}`;
    progress.show(`${where} ...`);
    const { env, set } = envOf(j.series);
    const m = await runOne({
      root: ROOT, phase: j.phase, series: j.series, mode: j.mode, size: j.size, streams: j.streams, pairs: j.pairs,
      inflight: j.inflight, duration: o.duration, warmup: o.warmup, version: o.version, timeout: o.timeout, lib, env, seriesEnv: set,
    });
    ms.push(m);
    if (!m.error) seen[kind(j)].push(Math.max(0, m.wallSeconds - o.duration - o.warmup));
    progress.show(`${where}: ${summary(m)}${k + 1 < total ? ` (about ${eta(left(k + 1))} left)` : ''}`);
    if (m.error) {
      progress.done();
      process.stderr.write(`bench: ${where}: ${m.error}\n`);
    }
    if (m.shmLeft) {
      progress.done();
      process.stderr.write(`bench: ${where}: libfabric left ${m.shmLeft.join(', ')} behind (removed by tsnet-bench)\n`);
      // What the plugin said of it, if anything (an endpoint whose close gave up on a stuck I/O thread).
      for (const w of m.warnings ?? []) process.stderr.write(`bench: ${where}: ${w}\n`);
    }
  }
  progress.done();
  const finished = new Date();

  const points = aggregate(o.sizes, ms, o.streams);
  const v = verdict(points);
  const ofiPoints = o.ofi.map((p) => ({ provider: p, points: aggregateOfi(p, ms, points) }));
  const ratePoints = aggregateRate(o.rateSizes, o.ratePairs, o.inflight, ms);
  const failures = ms.filter((m) => m.error);
  const shmLeft = ms.flatMap((m) => m.shmLeft ?? []);
  const out = path.resolve(process.cwd(), o.out);
  fs.mkdirSync(out, { recursive: true });
  const names = seriesNames(o.streams);
  // test() runs on the driving thread and enters no plugin thread, so bench.c's --spin (which
  // npm start does not pass) spins a thread that is not counted.
  const cpuNote =
    `CPU µs per message = schedstat run time of each side's protocol threads (tsnet-plugin, tsnet-proto*) ` +
    `and I/O threads (tsnet-io*) in the window / messages; it includes any busy-poll window of those threads ` +
    `(TSNET_SPIN_US, ${spinUs} µs here) and is then an upper bound (the bench's --spin polls on the driving thread, not counted)`;
  const json = {
    schema: 'tsnet-bench/2',
    started: started.toISOString(),
    finished: finished.toISOString(),
    options: { ...o, lib },
    machine,
    method: {
      latency: 'ping-pong, one message each way; one-way latency = RTT / 2 per iteration; median and p99 per run',
      bandwidth: `${BW_INFLIGHT} messages in flight (tsnet); TCP streams continuously, stripes as tsnet cuts them; bytes received / s in the window`,
      ofi: 'tsnet with TSNET_TRANSPORT=ofi and FI_PROVIDER=tcp or shm (TSNET_LIBFABRIC = the library found), latency and bandwidth as above, in the same rounds; ratios against the first table\'s plain TCP',
      rate: `messages received / s over P comm pairs with ${o.inflight} in flight per comm (tsnet-bw --pairs P --inflight ${o.inflight}), plain TCP over P streams (tcp-bw --streams P); ${cpuNote}`,
      spread: 'median over the repeats, min and max of the repeats',
      interleaving: `per size and repeat: tsnet-lat, tcp-lat, tsnet-bw, tcp-bw 1 stream, tcp-bw N streams, then per libfabric provider ofi-lat, ofi-bw; then per rate size and repeat, per pair count: tsnet, tcp`,
      series: names,
    },
    targets: TARGETS,
    verdict: v,
    points,
    ofi: {
      libfabric,
      skipped: ofiSkipped,
      providers: o.ofi,
      series: Object.fromEntries(ofiPoints.map((x) => [x.provider, { env: ofiSet(x.provider), points: x.points }])),
    },
    rate: {
      sizes: o.rateSizes,
      pairs: o.ratePairs,
      inflight: o.inflight,
      spinUs,
      note: cpuNote,
      points: ratePoints,
    },
    failures: failures.length,
    shmLeft,
    runs: ms,
  };
  const jsonPath = path.join(out, 'bench.json');
  const svgPath = path.join(out, 'bench.svg');
  const rateSvgPath = path.join(out, 'bench-rate.svg');
  fs.writeFileSync(jsonPath, `${JSON.stringify(json, null, 2)}\n`);
  const about =
    `${machine.cpuModel}, ${machine.cores} cores, ${machine.os}, Linux ${machine.kernel}; tsnet ${machine.tsnetCommit.slice(0, 12)}; ` +
    `medians of ${o.repeats} repeat(s), ${o.duration} s each`;
  fs.writeFileSync(
    svgPath,
    renderSvg(points, { title: `tsnet${o.ofi.length ? ' (TCP and libfabric)' : ''} vs plain TCP over loopback`, subtitle: about, streams: o.streams }, ofiPoints),
  );
  const svgs = [svgPath];
  if (ratePoints.length) {
    fs.writeFileSync(
      rateSvgPath,
      renderRateSvg(ratePoints, { title: `Message rate, ${o.inflight} in flight per comm: tsnet vs plain TCP over loopback`, subtitle: about }),
    );
    svgs.push(rateSvgPath);
  } else if (fs.existsSync(rateSvgPath)) fs.rmSync(rateSvgPath); // not from this run

  const rel = (p: string) => (path.relative(process.cwd(), p).startsWith('..') ? p : path.relative(process.cwd(), p));
  let text =
    `\ntsnet vs plain TCP over loopback (${machine.cores} cores, ${machine.cpuModel}); ` +
    `latency in µs (one-way), bandwidth in GB/s; median (min-max) of ${o.repeats} repeat(s)\n\n` +
    `${table(points, o.streams)}\n\n` +
    `lat x = tsnet / TCP median latency; bw x = tsnet / TCP with ${o.streams} streams\n` +
    `target bandwidth: ${v.bandwidth.text}\n` +
    `target latency:   ${v.latency.text}\n`;
  for (const x of ofiPoints) {
    const connect = x.points.flatMap((p) => p.connectSeconds?.values ?? []).sort((a, b) => a - b);
    text +=
      `\ntsnet over libfabric, FI_PROVIDER=${x.provider} (TSNET_TRANSPORT=ofi); same units, rounds and plain-TCP figures as above\n\n` +
      `${ofiTable(x.points)}\n\n` +
      `lat x = ofi ${x.provider} / TCP median latency; bw x = ofi ${x.provider} / TCP with ${o.streams} streams` +
      (connect.length ? `; connecting took ${connect[connect.length >> 1].toFixed(2)} s (median)` : '') +
      '\n';
  }
  if (ofiSkipped) text += `\nthe libfabric series were skipped: ${ofiSkipped}\n`;
  if (ratePoints.length) {
    text +=
      `\nmessage rate: messages/s with ${o.inflight} in flight per comm, tsnet over P comm pairs, plain TCP over P streams; ` +
      `CPU in µs per message; median (min-max) of ${o.repeats} repeat(s)\n\n` +
      `${rateTable(ratePoints)}\n\n` +
      `x tcp = tsnet / plain TCP messages/s at the same size and pairs\n` +
      `note: ${cpuNote}\n`;
  }
  text +=
    (failures.length ? `${failures.length} measurement(s) FAILED (see runs[].error in bench.json)\n` : '') +
    (shmLeft.length ? `libfabric left ${shmLeft.length} shm region(s) in /dev/shm (tsnet-bench removed them): ${shmLeft.join(', ')}\n` : '') +
    `\nwrote ${rel(jsonPath)}, ${svgs.map(rel).join(' and ')}\n`;
  process.stdout.write(text);
  return failures.length ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    process.stderr.write(`bench: ${(e as Error).stack ?? String(e)}\n`);
    process.exit(1);
  },
);
