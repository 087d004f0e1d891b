// The benchmark's options, where it finds libfabric, and its tables, without running anything.
import { describe, expect, it } from 'vitest';
import { findLibfabric } from './libfabric';
import { parseOptions, type Options } from './options';
import { aggregateRate, rateTable, spread, type Spread } from './report';
import type { Measurement } from './run';

const parse = (argv: string[], env: NodeJS.ProcessEnv = {}) => parseOptions(argv, env) as Options;

describe('options', () => {
  it('defaults: 3 repeats, rate 8 B, 4 KiB, 128 KiB over 1 and 4 pairs with 32 in flight, both providers', () => {
    expect(parse([])).toMatchObject({
      repeats: 3,
      rateSizes: [8, 4096, 131072],
      ratePairs: [1, 4],
      inflight: 32,
      ofi: ['tcp', 'shm'],
      ofiExplicit: false,
    });
  });

  it('--quick: rate size 8 only', () => {
    expect(parse(['--quick'])).toMatchObject({ sizes: [8, 1 << 20], rateSizes: [8], ratePairs: [1, 4], repeats: 1 });
    expect(parse(['--quick', '--rate-sizes', '4K,8'])).toMatchObject({ rateSizes: [8, 4096] });
  });

  it('--rate-sizes, --rate-pairs, --inflight', () => {
    expect(parse(['--rate-sizes', 'none']).rateSizes).toEqual([]);
    expect(parse(['--rate-sizes=128K,8,8']).rateSizes).toEqual([8, 131072]);
    expect(parse(['--rate-pairs', '4,1,2']).ratePairs).toEqual([1, 2, 4]);
    expect(parse(['--inflight', '1']).inflight).toBe(1);
    expect(() => parse(['--inflight', '33'])).toThrow(/1\.\.32/);
    expect(() => parse(['--inflight', '0'])).toThrow(/positive integer/);
    expect(() => parse(['--rate-pairs', '17'])).toThrow(/at most 16/);
    expect(() => parse(['--rate-sizes', ''])).toThrow(/at least one size \(or none\)/);
    expect(() => parse(['--sizes', 'none'])).toThrow(/bad size/);
  });

  it('--ofi', () => {
    expect(parse(['--ofi', 'shm,tcp'])).toMatchObject({ ofi: ['tcp', 'shm'], ofiExplicit: true });
    expect(parse(['--ofi', 'shm'])).toMatchObject({ ofi: ['shm'], ofiExplicit: true });
    expect(parse(['--ofi=none'])).toMatchObject({ ofi: [], ofiExplicit: true });
    expect(() => parse(['--ofi', 'verbs'])).toThrow(/unknown provider 'verbs'/);
  });
});

describe('findLibfabric', () => {
  const only = (...paths: string[]) => (p: string) => paths.includes(p);
  const none = () => '';

  it('TSNET_LIBFABRIC first, and only it when set', () => {
    expect(findLibfabric({ TSNET_LIBFABRIC: '/x/libfabric.so.1' }, { exists: only('/x/libfabric.so.1', '/usr/lib/libfabric.so.1'), ldconfig: none })).toEqual({
      found: { path: '/x/libfabric.so.1', foundBy: 'TSNET_LIBFABRIC' },
    });
    expect(findLibfabric({ TSNET_LIBFABRIC: '/x/libfabric.so.1' }, { exists: only('/usr/lib/libfabric.so.1'), ldconfig: none })).toEqual({
      why: 'TSNET_LIBFABRIC=/x/libfabric.so.1 does not exist',
    });
  });

  it('then LD_LIBRARY_PATH, the lib dirs, then ldconfig -p', () => {
    const dirs = ['/usr/lib64', '/usr/lib'];
    expect(findLibfabric({ LD_LIBRARY_PATH: '/a::/b' }, { dirs, exists: only('/b/libfabric.so.1', '/usr/lib/libfabric.so.1'), ldconfig: none })).toEqual({
      found: { path: '/b/libfabric.so.1', foundBy: 'LD_LIBRARY_PATH' },
    });
    expect(findLibfabric({}, { dirs, exists: only('/usr/lib/libfabric.so.1'), ldconfig: none })).toEqual({
      found: { path: '/usr/lib/libfabric.so.1', foundBy: 'lib dirs' },
    });
    const listing = '3 libs found in cache `/etc/ld.so.cache\'\n\tlibfabric.so.1 (libc6,x86-64) => /opt/ofi/lib/libfabric.so.1\n';
    expect(findLibfabric({}, { dirs, exists: only('/opt/ofi/lib/libfabric.so.1'), ldconfig: () => listing })).toEqual({
      found: { path: '/opt/ofi/lib/libfabric.so.1', foundBy: 'ldconfig -p' },
    });
    const missing = findLibfabric({}, { dirs, exists: only(), ldconfig: () => listing });
    expect('why' in missing && missing.why).toMatch(/^libfabric\.so\.1 not found \(.*\/usr\/lib64, \/usr\/lib.*ldconfig -p\)/);
  });
});

describe('the rate table', () => {
  const bw = (series: 'tsnet' | 'tcp', pairs: number, msgs: number, cpu?: number): Measurement => ({
    phase: 'rate',
    series,
    mode: series === 'tsnet' ? 'tsnet-bw' : 'tcp-bw',
    size: 8,
    streams: series === 'tcp' ? pairs : null,
    pairs,
    inflight: 32,
    env: {},
    args: [],
    wallSeconds: 1,
    result: {
      mode: series === 'tsnet' ? 'tsnet-bw' : 'tcp-bw',
      size: 8,
      streams: null,
      messages: msgs,
      bytes: 8 * msgs,
      seconds: 1,
      bw_GBps: (8 * msgs) / 1e9,
      msgs_per_s: msgs,
      ...(cpu === undefined ? {} : { cpu_us_per_msg: { send_proto: cpu, send_io: cpu / 2, recv_proto: cpu * 2, recv_io: cpu / 4 } }),
    },
  });

  it('medians, min-max, the ratio to TCP, CPU for tsnet only', () => {
    const ms = [bw('tsnet', 1, 1000, 8), bw('tsnet', 1, 3000, 4), bw('tsnet', 1, 2000, 6), bw('tcp', 1, 4000), bw('tcp', 1, 8000), bw('tcp', 1, 6000)];
    const [tsnet, tcp] = aggregateRate([8], [1], 32, ms);
    expect(tsnet.msgsPerS).toEqual(spread([1000, 3000, 2000]));
    expect(tsnet.ratio).toBeCloseTo(2000 / 6000);
    expect((tsnet.cpuUsPerMsg?.recvProto as Spread).median).toBe(12);
    expect(tcp).toMatchObject({ series: 'tcp', ratio: null, cpuUsPerMsg: null });
    const lines = rateTable([tsnet, tcp]).split('\n');
    expect(lines[0]).toMatch(/^size\s+pairs\s+series\s+msgs\/s\s+x tcp\s+send proto µs\s+recv proto µs\s+send io µs\s+recv io µs$/);
    expect(lines[2]).toMatch(/^8 B\s+1\s+tsnet\s+2000 \(1000-3000\)\s+0\.333\s+6\.00 \(4\.00-8\.00\)\s+12\.0 \(8\.00-16\.0\)\s+3\.00 \(2\.00-4\.00\)\s+1\.50 \(1\.00-2\.00\)$/);
    expect(lines[3]).toMatch(/^8 B\s+1\s+tcp\s+6000 \(4000-8000\)\s+-\s+-\s+-\s+-\s+-$/);
  });
});
