// Many comm pairs of one process open at once (the driver's `many` scenario, 256 pairs): every
// listen first, then connects and accepts in sweeps over all of them, 3 rounds of a 64 KiB
// message on every pair posted before any is tested, each validated, every close. Over TCP (5
// sockets per comm: 2560 descriptors) and, with libfabric, over shm and tcp.
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
