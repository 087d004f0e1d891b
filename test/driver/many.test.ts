// Many comm pairs of one process open at once (the driver's `many` scenario, 256 pairs): every
// listen first, then connects and accepts in sweeps over all of them, 3 rounds of a 64 KiB
// message on every pair posted before any is tested, each validated, every close; all of it
// twice, and the process's resident memory per pair bounded, with every pair up and after the
// last close (over libfabric: what the second cycle adds). Over TCP (5
// sockets per comm: 2560 descriptors) and, with libfabric, over shm and tcp. Then over shm 1500
// pairs quiet for 2.5 heartbeat periods first: 3000 heartbeats at the same ticks into one
// endpoint, more than shm holds without receives posted; before the engine posted receives past
// sends that wait for room, its bounce buffers waited behind those sends and every comm failed.
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const TRANSPORTS: [string, Record<string, string>][] = [['tcp', { TSNET_TRANSPORT: 'tcp' }]];
if (HAVE_LIBFABRIC)
  TRANSPORTS.push(['libfabric shm', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm' }], ['libfabric tcp', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'tcp' }]);

/**
 * Resident memory a pair of comms may add over TCP, the driver's own 128 KiB per pair included.
 * The receiver's per-slot objects (256 per receive comm, 1 KiB each) took it to 1070 KiB per
 * pair; since they come from a pool, 570 (docs/performance.md, item 38), and about 470 since a
 * request slot keeps one buffer and sends come from a pool too (item 39). Not checked over
 * libfabric: its endpoint and the provider's own memory come with the first listen, after the
 * baseline (61 to 162 MiB before, from run to run, with libfabric tcp).
 */
const KIB_PER_PAIR = 850;
/**
 * Resident memory a closed pair may leave behind over TCP, 1 s after the last close of the
 * second cycle, against the baseline before the first listen (the warm-up off, as here: V8's
 * compiled code and grown heap count too). Before the rings were mapped pages and a protocol
 * thread collected garbage once its last comm had closed, 548-560 KiB per pair stayed (a closed
 * comm's ring waited for V8, then stayed in the C allocator's heap); 320-325 since
 * (docs/performance.md, item 40).
 */
const KEPT_KIB_PER_PAIR = 430;
/**
 * Over libfabric: what the second cycle's 256 pairs add to what the first cycle left, both
 * measured 1 s after the cycle's closes, while the closed comms' registered staging and mailbox
 * are still held (TSNET_TIMEOUT_SEC: the peer may still write). 453-478 KiB per pair while those
 * buffers came from the C allocator with every byte written; 256 since they are mapped pages,
 * resident only where touched (docs/performance.md, item 41).
 */
const OFI_CYCLE_KIB_PER_PAIR = 360;

describe('256 comm pairs of one process open at once, twice', () => {
  for (const [name, env] of TRANSPORTS)
    it(`${name}: every pair connects, carries 3 validated messages and closes; then again; memory per pair bounded`, async () => {
      requireLib();
      const r = await runAsync('bash', ['-c', 'ulimit -n 4096 2>/dev/null; exec "$0" "$@"', buildDriver(), 'many', '--procs', '1', '--version', '12', '--lib', LIB], {
        cwd: ROOT,
        env: driverEnv({ ...env, TSNET_TEST_PAIRS: '256', TSNET_TEST_CYCLES: '2' }),
        timeout: 240_000,
      });
      expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), r.stderr.slice(-3000)).toEqual([]);
      for (const cycle of [1, 2]) {
        for (const round of [0, 1, 2]) expect(r.stdout).toMatch(new RegExp(`^ok - v12 many, cycle ${cycle}: round ${round}: a 64 KiB message on each of 256 pairs in `, 'm'));
        expect(r.stdout).toMatch(new RegExp(`^ok - v12 many, cycle ${cycle}: closeSend, closeRecv and closeListen of 256 pairs return 0 \\(768 of 768\\)$`, 'm'));
      }
      const before = Number(/^# v12 many: resident before the first cycle: (\d+) KiB$/m.exec(r.stdout)?.[1]);
      const up = Number(/^# v12 many, cycle 1: resident with every pair up: (\d+) KiB$/m.exec(r.stdout)?.[1]);
      expect(before).toBeGreaterThan(0);
      expect(up).toBeGreaterThan(0);
      const after = Number(/^# v12 many, cycle 2: resident after 2 cycle\(s\) of 256 pairs: (\d+) KiB$/m.exec(r.stdout)?.[1]);
      expect(after).toBeGreaterThan(0);
      if (env.TSNET_TRANSPORT === 'tcp') {
        expect((up - before) / 256, `resident ${before} KiB before, ${up} KiB with 256 pairs up`).toBeLessThan(KIB_PER_PAIR);
        expect((after - before) / 256, `resident ${before} KiB before, ${after} KiB after two cycles of 256 pairs`).toBeLessThan(KEPT_KIB_PER_PAIR);
      } else {
        const after1 = Number(/^# v12 many, cycle 1: resident after 1 cycle\(s\) of 256 pairs: (\d+) KiB$/m.exec(r.stdout)?.[1]);
        expect(after1).toBeGreaterThan(0);
        expect((after - after1) / 256, `resident ${after1} KiB after one cycle of 256 pairs, ${after} KiB after two`).toBeLessThan(OFI_CYCLE_KIB_PER_PAIR);
      }
      expect(r.status).toBe(0);
    }, 300_000);
});

describe.runIf(HAVE_LIBFABRIC)('libfabric shm: a burst of heartbeats from 3000 quiet comms into one endpoint', () => {
  it('1500 pairs quiet for 2.5 s with a heartbeat every second: every message of the rounds after it still arrives', async () => {
    requireLib();
    const r = await runAsync(buildDriver(), ['many', '--procs', '1', '--version', '12', '--lib', LIB], {
      cwd: ROOT,
      env: driverEnv({ TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm', TSNET_TEST_PAIRS: '1500', TSNET_TEST_QUIET_MS: '2500', TSNET_TIMEOUT_SEC: '4' }),
      timeout: 240_000,
    });
    expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), r.stderr.slice(-3000)).toEqual([]);
    expect(r.stdout).toMatch(/^# v12 many: every comm quiet for 2500 ms$/m);
    for (const round of [0, 1, 2]) expect(r.stdout).toMatch(new RegExp(`^ok - v12 many: round ${round}: a 64 KiB message on each of 1500 pairs in `, 'm'));
    expect(r.status).toBe(0);
  }, 300_000);
});

/**
 * Full collections protocol thread 0 may run while 256 pairs come up, carry their messages and
 * close with 16 GiB of host memory registered on them (512 regions of 32 MiB): 3 without the
 * large regions, and 3 with them since a region's view is memory V8 does not count as its own;
 * counted, as N-API's external ArrayBuffers are, they took 21-51 (docs/performance.md, item 45).
 */
const FULL_GCS_WITH_LARGE_REGIONS = 12;

describe('host memory registered in large regions', () => {
  it('tcp: 512 regions of 32 MiB (16 GiB, never touched) registered and deregistered: every call succeeds, and V8 runs at most 12 full collections in the whole run', async () => {
    requireLib();
    const r = await runAsync('bash', ['-c', 'ulimit -n 4096 2>/dev/null; exec "$0" "$@"', buildDriver(), 'many', '--procs', '1', '--version', '12', '--lib', LIB, '--verbose'], {
      cwd: ROOT,
      env: driverEnv({ TSNET_TRANSPORT: 'tcp', TSNET_TEST_PAIRS: '256', TSNET_TEST_REG_MIB: '32', TSNET_STATS: '1', TSNET_PROTOCOL_THREADS: '1' }),
      timeout: 240_000,
    });
    expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), r.stderr.slice(-3000)).toEqual([]);
    expect(r.stdout).toMatch(/^ok - v12 many: regMr of 512 regions of 32 MiB in [\d.]+ s \(512\)$/m);
    expect(r.stdout).toMatch(/^# v12 many: deregMr of 512 large regions in [\d.]+ s$/m);
    const gc = [...r.stderr.matchAll(/NET\/tsnet stats: protocol thread 0: V8 collections (\d+) full \([\d.]+ ms\), (\d+) young \([\d.]+ ms\); heap [\d.]+ of [\d.]+ MiB, external ([\d.]+) MiB$/gm)];
    expect(gc.length, r.stderr.slice(-3000)).toBe(1);
    expect(Number(gc[0][1])).toBeLessThanOrEqual(FULL_GCS_WITH_LARGE_REGIONS);
    expect(r.status).toBe(0);
  }, 300_000);
});
