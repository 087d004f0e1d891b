// The warm-up at the process's first init (TSNET_WARMUP, native/warmup.cc) through the C
// driver: every process that loads the plugin sends the given number of messages to itself on
// each protocol thread before init returns, says so in one INFO line, closes what it opened,
// and the scenarios that follow pass as without it. Over TCP (v12 and v9, whose context is the
// process-wide one), the loopback transport, and libfabric's tcp and shm providers where
// libfabric is installed. The other driver suites run with TSNET_WARMUP=0 (driverEnv).
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const WARMUP = 300;

/**
 * Runs the driver with TSNET_WARMUP set and checks that it passed; returns, per process that
 * loaded the plugin (each scenario runs in processes of its own), the protocol threads its one
 * warm-up line names. Every process that read the configuration must have warmed up exactly
 * once, with at least one message (the warm-up also stops at a time limit, which a loaded
 * 2-core machine can reach before the count).
 */
async function runWarm(args: string[], env: Record<string, string>): Promise<number[]> {
  requireLib();
  const r = await runAsync(buildDriver(), [...args, '--verbose', '--lib', LIB], {
    cwd: ROOT,
    env: driverEnv({ ...env, TSNET_WARMUP: String(WARMUP) }),
    timeout: 240_000,
  });
  const failed = r.stdout.split('\n').filter((l) => l.startsWith('not ok'));
  expect(failed, r.stderr.slice(-4000)).toEqual([]);
  expect(r.stdout).toMatch(/^\d+ passed, 0 failed$/m);
  expect(r.signal).toBeNull();
  expect(r.status).toBe(0);
  expect(r.stderr).not.toMatch(/warm-up stopped/);
  const configured = [...r.stderr.matchAll(new RegExp(`^\\[(\\d+)\\].*NET/tsnet config: warm-up messages at init = ${WARMUP} \\(TSNET_WARMUP\\)$`, 'gm'))].map((m) => m[1]);
  const warmed = [
    ...r.stderr.matchAll(
      new RegExp(`^\\[(\\d+)\\].*NET/tsnet warm-up: (\\d+) of ${WARMUP} message\\(s\\) of 0 B to 64 KiB on each of (\\d+) protocol thread\\(s\\) in \\d+ ms`, 'gm'),
    ),
  ];
  expect(configured.length).toBeGreaterThan(0);
  expect(warmed.map((m) => m[1]).sort()).toEqual([...configured].sort());
  for (const m of warmed) expect(Number(m[2])).toBeGreaterThan(0);
  return warmed.map((m) => Number(m[3]));
}

describe('warm-up at init (TSNET_WARMUP)', () => {
  for (const version of [12, 9])
    it(`TCP, v${version}, 2 protocol threads: once per process, on every thread`, async () => {
      const threads = await runWarm(['transfer,grouped', '--procs', '2', '--version', String(version)], {
        TSNET_TRANSPORT: 'tcp',
        TSNET_PROTOCOL_THREADS: '2',
      });
      expect(new Set(threads)).toEqual(new Set([2]));
    }, 240_000);

  it('loopback, one process per scenario, later inits (lifecycle) do not warm up again', async () => {
    const threads = await runWarm(['transfer,grouped,lifecycle', '--procs', '1', '--version', '12'], {
      TSNET_TRANSPORT: 'loopback',
      TSNET_LOOPBACK_DEVICES: '2',
    });
    expect(new Set(threads)).toEqual(new Set([1]));
  }, 240_000);

  // NCCL posts its receives ahead of the data, so the protocol writes its small messages
  // straight into their buffers; a warm-up that posts receives and sends together sends them
  // eager, and only its 64 KiB messages (1 in 32) are written.
  it.skipIf(!HAVE_LIBFABRIC)('libfabric shm: small messages are written into receives posted ahead, as under NCCL', async () => {
    requireLib();
    const r = await runAsync(buildDriver(), ['tables', '--procs', '1', '--version', '12', '--verbose', '--lib', LIB], {
      cwd: ROOT,
      env: driverEnv({ TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm', TSNET_WARMUP: String(WARMUP), TSNET_STATS: 'steps' }),
      timeout: 240_000,
    });
    expect(r.status, r.stderr.slice(-3000)).toBe(0);
    expect(r.stderr).toMatch(new RegExp(`NET/tsnet warm-up: ${WARMUP} of ${WARMUP} message`));
    const m = r.stderr.match(/NET\/tsnet stats: steps of isend of the warm-up on protocol thread \d+, (\d+) requests, .*$/m);
    expect(m, r.stderr.slice(-3000)).not.toBeNull();
    expect(Number(m![1])).toBe(WARMUP);
    expect(r.stderr).not.toMatch(/NET\/tsnet stats: steps of isend on protocol thread/); // the scenario sends nothing
    // Requests whose last step was a write (written→done), by the I/O thread or injected by
    // the protocol thread itself: about half measured, with doorbells or without (156 and 157
    // of 300), against 3% for the 64 KiB ones alone. Which thread wrote them moves with how
    // long the I/O thread sleeps (submitted→written: 36 with doorbells, 127 without), so the
    // count is of the writes. An interval every request had shows no count.
    const count = (step: string) => {
      const c = m![0].match(new RegExp(`; ${step} [\\d.]+ / [\\d.]+( \\((\\d+)\\))?(;|$)`));
      return c ? Number(c[2] ?? WARMUP) : 0;
    };
    expect(count('written→done'), m![0]).toBeGreaterThanOrEqual(WARMUP / 5);
    expect(count('written→done') + count('sent→done'), m![0]).toBe(WARMUP);
  }, 240_000);

  for (const provider of ['tcp', 'shm'])
    it.skipIf(!HAVE_LIBFABRIC)(`libfabric ${provider}, 2 protocol threads`, async () => {
      const threads = await runWarm(['transfer,grouped', '--procs', '2', '--version', '12'], {
        TSNET_TRANSPORT: 'ofi',
        FI_PROVIDER: provider,
        TSNET_PROTOCOL_THREADS: '2',
      });
      expect(new Set(threads)).toEqual(new Set([2]));
    }, 240_000);
});
