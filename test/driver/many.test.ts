// Many comm pairs of one process open at once (the driver's `many` scenario, 256 pairs): every
// listen first, then connects and accepts in sweeps over all of them, 3 rounds of a 64 KiB
// message on every pair posted before any is tested, each validated, every close. Over TCP (5
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

describe('256 comm pairs of one process open at once', () => {
  for (const [name, env] of TRANSPORTS)
    it(`${name}: every pair connects, carries 3 validated messages and closes`, async () => {
      requireLib();
      const r = await runAsync('bash', ['-c', 'ulimit -n 4096 2>/dev/null; exec "$0" "$@"', buildDriver(), 'many', '--procs', '1', '--version', '12', '--lib', LIB], {
        cwd: ROOT,
        env: driverEnv({ ...env, TSNET_TEST_PAIRS: '256' }),
        timeout: 240_000,
      });
      expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), r.stderr.slice(-3000)).toEqual([]);
      for (const round of [0, 1, 2]) expect(r.stdout).toMatch(new RegExp(`^ok - v12 many: round ${round}: a 64 KiB message on each of 256 pairs in `, 'm'));
      expect(r.stdout).toMatch(/^ok - v12 many: closeSend, closeRecv and closeListen of 256 pairs return 0 \(768 of 768\)$/m);
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
