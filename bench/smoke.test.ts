// Smoke test of the loopback benchmark: `node dist/bench/main.js --quick` runs end to end
// through the built plugin (over its TCP transport, over libfabric's tcp and shm providers where
// libfabric is installed, and the message rate) and writes the tables, bench.json, bench.svg and
// bench-rate.svg of the right shape. It checks shapes only, never a speed. Needs `npm run build`
// (npm test does it first).
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runAsync, type Ran } from '../test/support/spawn';
import { findLibfabric } from './libfabric';
import { BENCH_BIN, buildBench } from './run';

const root = path.resolve(__dirname, '..');
const out = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-bench-'));
afterAll(() => fs.rmSync(out, { recursive: true, force: true }));

const HAVE_LIBFABRIC = 'found' in findLibfabric(process.env);
const PROVIDERS = HAVE_LIBFABRIC ? ['tcp', 'shm'] : [];
const SPREAD = ['max', 'median', 'min', 'values'];
// The bench's stderr lines about regions left behind and the plugin's WARN lines.
const leftLines = (stderr: string) => stderr.split('\n').filter((l) => /left behind|libfabric left|WARN/.test(l)).slice(-20).join('\n');

describe('bench --quick', () => {
  let run: Ran;
  beforeAll(async () => {
    run = await runAsync(process.execPath, ['dist/bench/main.js', '--quick', '--streams', '2', '--out', out], {
      cwd: root,
      timeout: 240_000,
    });
  }, 300_000);

  it('exits 0 and prints the table and the verdict', () => {
    expect(run.stderr).toMatch(/\[1\/\d+\] 8 B repeat 1\/1 tsnet latency/);
    expect(run.status, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^size\s+tsnet lat p50\s+p99\s+tcp lat p50\s+p99\s+lat x\s+tsnet GB\/s\s+tcp-1 GB\/s\s+tcp-2 GB\/s\s+bw x$/m);
    expect(run.stdout).toMatch(/^8 B\s+\S/m);
    expect(run.stdout).toMatch(/^1 MiB\s+\S/m);
    expect(run.stdout).toMatch(/^target bandwidth: (MET|NOT MET)/m);
    expect(run.stdout).toMatch(/^target latency: +(MET|NOT MET)/m);
    expect(run.stdout).not.toMatch(/FAILED/);
  });

  it.runIf(HAVE_LIBFABRIC)('prints one table per libfabric provider', () => {
    expect(run.stderr).toMatch(/^bench: libfabric: \S+libfabric\.so\.1 \(found by [^)]+\); providers tcp, shm$/m);
    const tables = run.stdout.split(/^tsnet over libfabric, FI_PROVIDER=/m).slice(1);
    expect(tables.map((t) => t.slice(0, 3))).toEqual(['tcp', 'shm']);
    for (const t of tables) {
      expect(t).toMatch(/^size\s+lat p50\s+p99\s+lat x\s+GB\/s\s+bw x$/m);
      expect(t).toMatch(/^8 B\s+\d\S*\s+\d\S*\s+\d\S*\s+\d\S*\s+\d\S*$/m);
      expect(t).toMatch(/^1 MiB\s+\d\S*\s+\d\S*\s+\d\S*\s+\d\S*\s+\d\S*$/m);
      expect(t).toMatch(/; connecting took \d+\.\d+ s \(median\)$/m);
    }
  });

  it.runIf(!HAVE_LIBFABRIC)('says that the libfabric series were skipped', () => {
    expect(run.stdout).toMatch(/^the libfabric series were skipped: /m);
  });

  it('prints the message-rate table with its note', () => {
    expect(run.stdout).toMatch(/^size\s+pairs\s+series\s+msgs\/s\s+x tcp\s+send proto µs\s+recv proto µs\s+send io µs\s+recv io µs$/m);
    for (const pairs of [1, 4]) {
      expect(run.stdout).toMatch(new RegExp(`^8 B\\s+${pairs}\\s+tsnet\\s+\\d+\\s+\\d\\S*(\\s+\\d\\S*){4}$`, 'm'));
      expect(run.stdout).toMatch(new RegExp(`^8 B\\s+${pairs}\\s+tcp\\s+\\d+\\s+-(\\s+-){4}$`, 'm'));
    }
    expect(run.stdout).toMatch(/^note: CPU µs per message = .*busy-poll window of those threads \(TSNET_SPIN_US, \d+ µs here\) and is then an upper bound \(the bench's --spin .*\)$/m);
    expect(run.stdout).toMatch(/^wrote \S+bench\.json, \S+bench\.svg and \S+bench-rate\.svg$/m);
  });

  it('writes bench.json with every figure and the machine', () => {
    const j = JSON.parse(fs.readFileSync(path.join(out, 'bench.json'), 'utf8'));
    expect(j.schema).toBe('tsnet-bench/2');
    expect(j.options).toMatchObject({ quick: true, repeats: 1, streams: 2, sizes: [8, 1048576], rateSizes: [8], ratePairs: [1, 4], inflight: 32, ofi: PROVIDERS });
    for (const k of ['os', 'kernel', 'cpuModel', 'cores', 'memoryBytes', 'node', 'tsnetCommit', 'env'])
      expect(j.machine).toHaveProperty(k);
    expect(j.machine.env).toMatchObject({ TSNET_TRANSPORT: expect.any(String), NCCL_SOCKET_IFNAME: expect.any(String), TSNET_NSOCKS: '2' });
    expect(j.failures).toBe(0);
    // The plugin closes its endpoints at the last finalize, and shm's regions go with them. One
    // may stay only where a close gave up on an I/O thread stuck inside libfabric past the
    // last finalize's wait, and the plugin says so in a WARN.
    for (const r of j.runs.filter((r: { shmLeft?: string[] }) => r.shmLeft))
      expect(r.warnings?.join('\n') ?? '', `${r.series} ${r.mode} ${r.size} B left ${r.shmLeft.join(', ')}; the bench said:\n${leftLines(run.stderr)}`).toMatch(
        /WARN NET\/tsnet ofi: \d+ endpoint\(s\) whose close gave up on an I\/O thread stuck inside libfabric are still open/,
      );
    expect(j.shmLeft).toEqual(j.runs.flatMap((r: { shmLeft?: string[] }) => r.shmLeft ?? []));
    // 2 sizes x 1 repeat x (tsnet-lat, tcp-lat, tsnet-bw, tcp-bw x1, tcp-bw x2, per provider ofi-lat and ofi-bw)
    // + 1 rate size x 1 repeat x 2 pair counts x (tsnet, tcp)
    expect(j.runs).toHaveLength(2 * (5 + 2 * PROVIDERS.length) + 4);
    for (const r of j.runs) {
      expect(r.error).toBeUndefined();
      expect(r.result.mode).toBe(r.mode);
      expect(r.result.size).toBe(r.size);
      expect(['latbw', 'ofi', 'rate']).toContain(r.phase);
      expect(['tsnet', 'ofi-tcp', 'ofi-shm', 'tcp']).toContain(r.series);
      expect(r.pairs).toEqual(expect.any(Number));
      expect(r.inflight).toEqual(expect.any(Number));
      if (r.mode.endsWith('-lat')) {
        expect(Object.keys(r.result.lat_us).sort()).toEqual(['max', 'mean', 'median', 'min', 'p99']);
        expect([r.pairs, r.inflight]).toEqual([1, 1]);
      } else expect(r.result.bw_GBps).toBeGreaterThan(0);
      if (r.mode.startsWith('tsnet')) expect(Object.keys(r.result.setup_s).sort()).toEqual(['connect', 'init']);
      if (r.series.startsWith('ofi-')) expect(r.env).toMatchObject({ TSNET_TRANSPORT: 'ofi', FI_PROVIDER: r.series.slice(4) });
      if (r.phase === 'rate') {
        expect(r.inflight).toBe(32);
        expect(r.result.pairs).toBe(r.mode === 'tsnet-bw' ? r.pairs : 1);
        if (r.mode === 'tcp-bw') expect(r.streams).toBe(r.pairs);
      }
    }
    expect(j.points.map((p: { size: number }) => p.size)).toEqual([8, 1048576]);
    for (const p of j.points) {
      for (const s of [p.latencyUs.tsnet.median, p.latencyUs.tsnet.p99, p.latencyUs.tcp.median, p.bandwidthGBps.tsnet, p.bandwidthGBps.tcp1, p.bandwidthGBps.tcpN])
        expect(Object.keys(s).sort()).toEqual(SPREAD);
      expect(typeof p.ratios.latency).toBe('number');
      expect(typeof p.ratios.bandwidth).toBe('number');
    }
    expect(j.verdict.bandwidth.met).toEqual(expect.any(Boolean));
    expect(j.verdict.latency.met).toEqual(expect.any(Boolean));
  });

  it('bench.json: the ofi section', () => {
    const j = JSON.parse(fs.readFileSync(path.join(out, 'bench.json'), 'utf8'));
    expect(j.ofi.providers).toEqual(PROVIDERS);
    expect(Object.keys(j.ofi.series)).toEqual(PROVIDERS);
    if (!HAVE_LIBFABRIC) {
      expect(j.ofi.skipped).toEqual(expect.any(String));
      return;
    }
    expect(j.ofi.skipped).toBeNull();
    expect(j.ofi.libfabric).toMatchObject({ path: expect.stringMatching(/libfabric\.so\.1$/), foundBy: expect.any(String) });
    for (const p of PROVIDERS) {
      const s = j.ofi.series[p];
      expect(s.env).toMatchObject({ TSNET_TRANSPORT: 'ofi', FI_PROVIDER: p, TSNET_LIBFABRIC: j.ofi.libfabric.path });
      expect(s.points.map((x: { size: number }) => x.size)).toEqual([8, 1048576]);
      for (const x of s.points) {
        for (const sp of [x.latencyUs.median, x.latencyUs.p99, x.bandwidthGBps, x.connectSeconds]) expect(Object.keys(sp).sort()).toEqual(SPREAD);
        for (const k of ['latency', 'latencyP99', 'bandwidth', 'bandwidthVsTsnetTcp']) expect(typeof x.ratios[k]).toBe('number');
      }
    }
  });

  it('bench.json: the rate section', () => {
    const j = JSON.parse(fs.readFileSync(path.join(out, 'bench.json'), 'utf8'));
    expect(j.rate).toMatchObject({ sizes: [8], pairs: [1, 4], inflight: 32, spinUs: expect.any(Number), note: expect.stringMatching(/upper bound/) });
    expect(j.rate.points.map((p: { pairs: number; series: string }) => `${p.pairs} ${p.series}`)).toEqual(['1 tsnet', '1 tcp', '4 tsnet', '4 tcp']);
    for (const p of j.rate.points) {
      expect(p).toMatchObject({ size: 8, inflight: 32 });
      expect(Object.keys(p.msgsPerS).sort()).toEqual(SPREAD);
      if (p.series === 'tsnet') {
        expect(typeof p.ratio).toBe('number');
        expect(Object.keys(p.cpuUsPerMsg).sort()).toEqual(['recvIo', 'recvProto', 'sendIo', 'sendProto']);
        for (const s of Object.values(p.cpuUsPerMsg)) expect(Object.keys(s as object).sort()).toEqual(SPREAD);
      } else {
        expect(p.ratio).toBeNull();
        expect(p.cpuUsPerMsg).toBeNull();
      }
    }
  });

  it('writes bench.svg with both panels and every series', () => {
    const svg = fs.readFileSync(path.join(out, 'bench.svg'), 'utf8');
    expect(svg.startsWith('<svg')).toBe(true);
    for (const name of ['tsnet (2 sockets)', 'TCP, 1 stream', 'TCP, 2 streams', 'tsnet median', 'TCP median', 'GB/s', 'µs'])
      expect(svg).toContain(name);
    for (const p of PROVIDERS) for (const name of [`tsnet over ofi ${p}`, `ofi ${p} median`]) expect(svg).toContain(name);
  });

  it('writes bench-rate.svg with both series', () => {
    const svg = fs.readFileSync(path.join(out, 'bench-rate.svg'), 'utf8');
    expect(svg.startsWith('<svg')).toBe(true);
    for (const name of ['Message rate', 'messages/s', 'tsnet', 'TCP', '8 B, 1 pair', '8 B, 4 pairs']) expect(svg).toContain(name);
  });
});

describe('bench without libfabric', () => {
  const env = { ...process.env, TSNET_LIBFABRIC: '/nonexistent/libfabric.so.1' };

  it('--ofi given explicitly: exits 2 with the reason, before measuring anything', async () => {
    const r = await runAsync(process.execPath, ['dist/bench/main.js', '--ofi', 'shm', '--out', out], { cwd: root, env, timeout: 60_000 });
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/^bench: --ofi shm: TSNET_LIBFABRIC=\/nonexistent\/libfabric\.so\.1 does not exist$/m);
    expect(r.stderr).not.toMatch(/\[1\//);
  });

  it('by default: skips the libfabric series with a note', async () => {
    const dir = path.join(out, 'no-ofi');
    const args = ['dist/bench/main.js', '--quick', '--sizes', '8', '--streams', '1', '--rate-sizes', 'none', '--duration', '0.05', '--out', dir];
    const r = await runAsync(process.execPath, args, { cwd: root, env, timeout: 120_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/^bench: the libfabric series are skipped: TSNET_LIBFABRIC=\S+ does not exist$/m);
    expect(r.stdout).toMatch(/^the libfabric series were skipped: /m);
    expect(r.stdout).not.toMatch(/FI_PROVIDER=|^size\s+pairs/m);
    const j = JSON.parse(fs.readFileSync(path.join(dir, 'bench.json'), 'utf8'));
    expect(j.ofi).toMatchObject({ libfabric: null, providers: [], series: {}, skipped: expect.any(String) });
    expect(j.rate.points).toEqual([]);
    expect(j.runs.map((x: { series: string }) => x.series)).toEqual(['tsnet', 'tcp', 'tsnet', 'tcp']);
    expect(fs.existsSync(path.join(dir, 'bench-rate.svg'))).toBe(false);
  }, 150_000);
});

describe('tsnet-bench --mem', () => {
  const haveCuda = ['/usr/lib/x86_64-linux-gnu/libcuda.so.1', '/usr/lib64/libcuda.so.1'].some((p) => fs.existsSync(p));
  const bin = path.join(root, BENCH_BIN);
  beforeAll(() => {
    buildBench(root);
  });

  it('--mem cuda is refused for the latency mode, and an unknown kind is a usage error', async () => {
    const lat = await runAsync(bin, ['tsnet-lat', '--size', '8', '--mem', 'cuda'], { cwd: root, timeout: 30_000 });
    expect(lat.status).toBe(1);
    expect(lat.stderr).toMatch(/--mem cuda is for tsnet-bw only/);
    const bad = await runAsync(bin, ['tsnet-bw', '--size', '8', '--mem', 'gpu'], { cwd: root, timeout: 30_000 });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/usage: tsnet-bench/);
  });

  it.skipIf(haveCuda)('--mem cuda without a CUDA driver: both sides stop with the reason', async () => {
    const r = await runAsync(bin, ['tsnet-bw', '--size', '8', '--mem', 'cuda', '--duration', '0.1', '--timeout', '10'], { cwd: root, timeout: 60_000 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/--mem cuda: no CUDA driver \(libcuda\.so\.1/);
    expect(r.stdout).toBe('');
  });
});

describe('tsnet-bench tsnet-lat --curve and --rounds', () => {
  const bin = path.join(root, BENCH_BIN);
  beforeAll(() => {
    buildBench(root);
  });

  it('measures exactly N round trips from the first and reports the medians of its buckets', async () => {
    const r = await runAsync(bin, ['tsnet-lat', '--size', '8', '--curve', '150', '--timeout', '20'], {
      cwd: root,
      env: { ...process.env, TSNET_TRANSPORT: 'tcp', TSNET_WARMUP: '0' },
      timeout: 60_000,
    });
    expect(r.status, r.stderr).toBe(0);
    const line = JSON.parse(r.stdout.trim().split('\n').pop()!);
    expect(line.iterations).toBe(150);
    expect(line.curve_us.map((c: { from: number; to: number }) => [c.from, c.to])).toEqual([[1, 1], [2, 10], [11, 100], [101, 150]]);
    for (const c of line.curve_us) expect(c.median).toBeGreaterThanOrEqual(line.lat_us.min);
  });

  it('is refused for the other modes and out of range', async () => {
    for (const args of [['tsnet-bw', '--size', '8', '--curve', '10'], ['tsnet-lat', '--size', '8', '--curve', '0']]) {
      const r = await runAsync(bin, args, { cwd: root, timeout: 30_000 });
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/--curve N is for tsnet-lat, N 1 \.\. 1000000/);
    }
  });

  it('--rounds R opens new comms R - 1 more times in the same processes and reports each round', async () => {
    const r = await runAsync(bin, ['tsnet-lat', '--size', '8', '--curve', '120', '--rounds', '3', '--timeout', '20', '--verbose'], {
      cwd: root,
      env: { ...process.env, TSNET_TRANSPORT: 'tcp', TSNET_WARMUP: '200' },
      timeout: 60_000,
    });
    expect(r.status, r.stderr).toBe(0);
    const line = JSON.parse(r.stdout.trim().split('\n').pop()!);
    expect(line.iterations).toBe(120);
    expect(line.rounds_us).toHaveLength(3);
    for (const round of line.rounds_us)
      expect(round.map((c: { from: number; to: number }) => [c.from, c.to])).toEqual([[1, 1], [2, 10], [11, 100], [101, 120]]);
    expect(line.rounds_us[0]).toEqual(line.curve_us);
    // each of the two processes warmed up once, at its first init, whatever the rounds
    expect(r.stderr.match(/NET\/tsnet warm-up: \d+ of 200 message\(s\)/g)).toHaveLength(2);
  });

  it('--rounds is refused for the other modes and out of range', async () => {
    for (const args of [['tsnet-bw', '--size', '8', '--rounds', '2'], ['tsnet-lat', '--size', '8', '--rounds', '21'], ['tsnet-lat', '--size', '8', '--rounds', '0']]) {
      const r = await runAsync(bin, args, { cwd: root, timeout: 30_000 });
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/--rounds R is for tsnet-lat, R 1 \.\. 20/);
    }
  });
});

