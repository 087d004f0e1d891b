// The protocol thread's event loop held past TSNET_TIMEOUT_SEC (1 s here): the driver's `held`
// scenario stops the whole process for 1.5 s (SIGSTOP from a child, as a paused VM or a
// preempted job), then holds a control call in the application's logger. A comm whose peer is
// alive must not fail for the silence of the stop: the first watchdog tick after a hold judges
// no comm (before, "nothing heard from the peer for 1.5 s" failed the waiting receive). The
// watchdog's WARN says what the thread did meanwhile: after the stop, that it neither ran nor
// waited for a CPU; after the held call, that it sat in that call (by name) without running.
// Last, a connect begun before a stop completes after it (over TCP its own timer failed it).
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const TRANSPORTS: [string, Record<string, string>][] = [['tcp', { TSNET_TRANSPORT: 'tcp' }]];
if (HAVE_LIBFABRIC) {
  TRANSPORTS.push(['libfabric shm', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm' }]);
  TRANSPORTS.push(['libfabric tcp', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'tcp' }]);
}

describe('an event loop held past the timeout: comms with live peers go on, the WARN says why', () => {
  for (const [name, env] of TRANSPORTS)
    it(name, async () => {
      requireLib();
      const r = await runAsync(buildDriver(), ['held', '--version', '12', '--timeout', '10', '--lib', LIB], {
        cwd: ROOT,
        env: driverEnv({ ...env, TSNET_PROTOCOL_THREADS: '1', TSNET_TIMEOUT_SEC: '1' }),
        timeout: 60_000,
      });
      const all = r.stdout + r.stderr;
      expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), all.slice(-3000)).toEqual([]);
      expect(r.status).toBe(0);
      expect(r.stdout).toMatch(/^ok - v12 held: stopped for 1\.5 s \(TSNET_TIMEOUT_SEC 1\), the process goes on: the receive still waits/m);
      expect(r.stdout).toMatch(/^ok - v12 held: then its message arrives, whole/m);
      expect(r.stdout).toMatch(/^ok - v12 held: a connect begun before the process was stopped for 1\.5 s completes once it runs again/m);
      expect(all).not.toMatch(/nothing heard from the peer/);
      const held = all.split('\n').filter((l) => /NET\/tsnet protocol thread 0: its event loop was held for \d+ ms/.test(l));
      expect(held.some((l) => /: it neither ran nor waited for a CPU: blocked \(a lock, a system call\), not woken, or the process was stopped$/.test(l)), held.join('\n')).toBe(true);
      expect(held.some((l) => /\(the longest: connect, \d+ ms\).*: it sat in its call connect, neither running nor waiting for a CPU/.test(l)), held.join('\n')).toBe(true);
    }, 90_000);
});
