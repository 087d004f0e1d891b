// Early wake-ups (TSNET_EARLY_WAKE, native/engine/engine_js.cc): a protocol thread that sleeps
// is woken by its lanes' sockets and doorbells together with the I/O thread that reads them.
// tsnet-bench's ping-pong with an idle gap before each round trip finds both sides' threads
// asleep every time; each side's protocol thread must count early wake-ups at finalize
// (TSNET_STATS), over TCP and over libfabric shm (doorbells), and none by default (off), with
// the setting off or without a busy-poll window to open. Latency is measured by
// `tsnet-bench --gap-us`, never here.
import * as path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { findLibfabric } from '../../bench/libfabric';
import { BENCH_BIN, buildBench } from '../../bench/run';
import { runAsync } from '../support/spawn';

const root = path.resolve(__dirname, '../..');
const HAVE_LIBFABRIC = 'found' in findLibfabric(process.env);
const LIB = path.join(root, 'build/libnccl-net-tsnet.so');

/** Runs the gap ping-pong; returns each process's early wake-ups (undefined: no such line). */
async function pingPong(env: Record<string, string>): Promise<{ a?: number; b?: number; trips: number; stderr: string }> {
  const r = await runAsync(path.join(root, BENCH_BIN), ['tsnet-lat', '--size', '8', '--duration', '0.6', '--gap-us', '3000', '--lib', LIB, '--verbose'], {
    cwd: root,
    env: { ...process.env, TSNET_WARMUP: '0', TSNET_STATS: '1', TSNET_SPIN_US: '200', ...env },
    timeout: 60_000,
  });
  expect(r.status, r.stderr).toBe(0);
  const early = (role: string) => {
    const m = new RegExp(`^\\[${role} \\d+\\] NET/tsnet stats: protocol thread 0: early wake-ups (\\d+) `, 'm').exec(r.stderr);
    return m ? Number(m[1]) : undefined;
  };
  const trips = Number(/"iterations":(\d+)/.exec(r.stdout)?.[1] ?? 0);
  return { a: early('A'), b: early('B'), trips, stderr: r.stderr };
}

describe('early wake-ups', () => {
  beforeAll(() => {
    buildBench(root);
  });

  it('over TCP, both sides\' protocol threads are woken by their control lanes', async () => {
    const r = await pingPong({ TSNET_EARLY_WAKE: '1' });
    expect(r.trips).toBeGreaterThan(20);
    // Each round trip finds both sides asleep once (A's reply, B's ping); a few may be missed
    // where a thread was still in its window or its I/O thread still held the lane's lock.
    expect(r.a, r.stderr).toBeGreaterThan(r.trips / 4);
    expect(r.b, r.stderr).toBeGreaterThan(r.trips / 4);
  }, 90_000);

  it.runIf(HAVE_LIBFABRIC)('over libfabric shm, by their endpoints\' doorbells', async () => {
    const r = await pingPong({ TSNET_EARLY_WAKE: '1', TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm' });
    expect(r.trips).toBeGreaterThan(20);
    // The I/O thread often drains the doorbell before the protocol thread's wake-up looks at
    // it (the wake-up is then lost, not counted): fewer than over TCP, but some on each side.
    expect(r.a, r.stderr).toBeGreaterThan(0);
    expect(r.b, r.stderr).toBeGreaterThan(0);
  }, 90_000);

  it('none by default or with TSNET_EARLY_WAKE=0 (no stats line), and none without a busy-poll window', async () => {
    const byDefault = await pingPong({});
    expect(byDefault.a).toBeUndefined();
    expect(byDefault.b).toBeUndefined();
    const off = await pingPong({ TSNET_EARLY_WAKE: '0' });
    expect(off.stderr).toMatch(/config: protocol threads woken with their I\/O threads = off \(TSNET_EARLY_WAKE\)/);
    expect(off.a).toBeUndefined();
    expect(off.b).toBeUndefined();
    const noWindow = await pingPong({ TSNET_EARLY_WAKE: '1', TSNET_SPIN_US: '0' });
    expect(noWindow.a, noWindow.stderr).toBe(0);
    expect(noWindow.b, noWindow.stderr).toBe(0);
  }, 90_000);
});
