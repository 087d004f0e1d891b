// Smoke test of the loopback benchmark: `node dist/bench/main.js --quick` runs end to end
// through the built plugin and writes a table, bench.json and bench.svg of the right shape.
// It checks shapes only, never a speed. Needs `npm run build` (npm test does it first).
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runAsync, type Ran } from '../test/support/spawn';

const root = path.resolve(__dirname, '..');
const out = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-bench-'));
afterAll(() => fs.rmSync(out, { recursive: true, force: true }));

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
  });

  it('writes bench.json with every figure and the machine', () => {
    const j = JSON.parse(fs.readFileSync(path.join(out, 'bench.json'), 'utf8'));
    expect(j.schema).toBe('tsnet-bench/1');
    expect(j.options).toMatchObject({ quick: true, repeats: 1, streams: 2, sizes: [8, 1048576] });
    for (const k of ['os', 'kernel', 'cpuModel', 'cores', 'memoryBytes', 'node', 'tsnetCommit', 'env'])
      expect(j.machine).toHaveProperty(k);
    expect(j.machine.env).toMatchObject({ TSNET_TRANSPORT: expect.any(String), NCCL_SOCKET_IFNAME: expect.any(String), TSNET_NSOCKS: '2' });
    expect(j.failures).toBe(0);
    // 2 sizes x 1 repeat x (tsnet-lat, tcp-lat, tsnet-bw, tcp-bw x1, tcp-bw x2)
    expect(j.runs).toHaveLength(10);
    for (const r of j.runs) {
      expect(r.error).toBeUndefined();
      expect(r.result.mode).toBe(r.mode);
      expect(r.result.size).toBe(r.size);
      if (r.mode.endsWith('-lat')) expect(Object.keys(r.result.lat_us).sort()).toEqual(['max', 'mean', 'median', 'min', 'p99']);
      else expect(r.result.bw_GBps).toBeGreaterThan(0);
    }
    expect(j.points.map((p: { size: number }) => p.size)).toEqual([8, 1048576]);
    for (const p of j.points) {
      for (const s of [p.latencyUs.tsnet.median, p.latencyUs.tsnet.p99, p.latencyUs.tcp.median, p.bandwidthGBps.tsnet, p.bandwidthGBps.tcp1, p.bandwidthGBps.tcpN])
        expect(Object.keys(s).sort()).toEqual(['max', 'median', 'min', 'values']);
      expect(typeof p.ratios.latency).toBe('number');
      expect(typeof p.ratios.bandwidth).toBe('number');
    }
    expect(j.verdict.bandwidth.met).toEqual(expect.any(Boolean));
    expect(j.verdict.latency.met).toEqual(expect.any(Boolean));
  });

  it('writes bench.svg with both panels and every series', () => {
    const svg = fs.readFileSync(path.join(out, 'bench.svg'), 'utf8');
    expect(svg.startsWith('<svg')).toBe(true);
    for (const name of ['tsnet (2 sockets)', 'TCP, 1 stream', 'TCP, 2 streams', 'tsnet median', 'TCP median', 'GB/s', 'µs'])
      expect(svg).toContain(name);
  });
});
