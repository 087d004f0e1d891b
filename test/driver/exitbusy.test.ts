// Processes that exit() while a thread of theirs connects and closes pairs through the plugin
// (the driver's exitbusy scenario, 12 processes each). exit() runs OpenSSL's cleanup and
// libnode's static destructors while tsnet's threads may be inside JavaScript: before tsnet
// stopped its threads first (embed/host.cc, onProcessExit), some of those processes died of
// SIGSEGV or malloc's corruption check during exit. Over TCP and, with libfabric, over shm.
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const TRANSPORTS: [string, Record<string, string>][] = [['tcp', { TSNET_TRANSPORT: 'tcp' }]];
if (HAVE_LIBFABRIC) TRANSPORTS.push(['libfabric shm, 3 protocol threads', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm', TSNET_PROTOCOL_THREADS: '3' }]);

describe('processes that exit while the plugin connects and closes', () => {
  for (const [name, env] of TRANSPORTS)
    it(`${name}: every one ends with status 0, no signal`, async () => {
      requireLib();
      const r = await runAsync(buildDriver(), ['exitbusy', '--version', '12', '--timeout', '20', '--lib', LIB], { cwd: ROOT, env: driverEnv(env), timeout: 240_000 });
      expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), r.stderr.slice(-3000)).toEqual([]);
      expect(r.stdout).toMatch(/^ok - v12 exitbusy: 12 of 12 processes that exited with a connect loop running ended cleanly$/m);
      expect(r.status).toBe(0);
    }, 300_000);
});
