// A process out of file descriptors (RLIMIT_NOFILE): the driver's transfer across two processes
// under `ulimit -n` from 20 to 60 (in steps of 8). Each limit runs out at another step (the I/O threads' epoll
// and eventfd at init or the first listen, the listening socket, a connect's sockets, the
// listener's dup of an accepted one), and every one must fail that call with ncclSystemError (2)
// and a WARN that names the limit, never an internal error, a JavaScript TypeError, a signal or
// a hang. Some limit in the sweep must fail, and a comfortable one must carry every transfer.
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const TRANSPORTS: [string, Record<string, string>][] = [['tcp', { TSNET_TRANSPORT: 'tcp' }]];
if (HAVE_LIBFABRIC) TRANSPORTS.push(['libfabric shm', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm', TSNET_TIMEOUT_SEC: '3' }]);

// What a role may say when a call failed for want of descriptors, or because its peer did.
const ALLOWED = [
  /: (init|listen on dev \d+|accept) \(rc 2\)$/,
  /: connect returned 2$/,
  /: cannot (listen|connect|accept)$/,
  /: the peer role failed, so this one stops too$/,
  /: the (sender|receiver) process reported its results \(exit status 1, /,
];

async function underLimit(n: number, env: Record<string, string>) {
  return runAsync('bash', ['-c', `ulimit -n ${n} && exec "$0" "$@"`, buildDriver(), 'transfer', '--procs', '2', '--version', '12', '--timeout', '30', '--lib', LIB], {
    cwd: ROOT,
    env: driverEnv(env),
    timeout: 120_000,
  });
}

describe('a process out of file descriptors', () => {
  for (const [name, env] of TRANSPORTS)
    it(`${name}: each call that runs out fails with ncclSystemError and a WARN naming RLIMIT_NOFILE; with room, every transfer passes`, async () => {
      requireLib();
      const failedAt: string[] = [];
      for (const n of [20, 28, 36, 44, 52, 60]) {
        const r = await underLimit(n, env);
        const lines = r.stdout.split('\n');
        const notOk = lines.filter((l) => l.startsWith('not ok'));
        const warns = r.stderr.split('\n').filter((l) => / log 2: /.test(l));
        const what = `ulimit -n ${n}:\n${notOk.join('\n')}\n${warns.join('\n')}\n${r.stderr.slice(-2000)}`;
        expect(r.signal, what).toBeNull();
        expect([0, 1], what).toContain(r.status);
        expect(lines.filter((l) => /died of signal|timed out|\(rc 3\)|returned 3/.test(l)), what).toEqual([]);
        for (const l of notOk) expect(ALLOWED.some((re) => re.test(l)), `${l}\n${what}`).toBe(true);
        expect(warns.filter((w) => /TypeError|Cannot read properties|internal error/.test(w)), what).toEqual([]);
        const emfile = warns.filter((w) => /EMFILE|Too many open files|too many open files/.test(w));
        // The listener of a process out of descriptors drops connections silently: its connector says it may be so.
        const dropped = warns.filter((w) => /its process is out of file descriptors: then it drops connections/.test(w));
        for (const w of emfile) expect(w, what).toMatch(new RegExp(`RLIMIT_NOFILE ${n}; `));
        if (r.status === 1) {
          expect(emfile.length + dropped.length, `a failed run names its cause\n${what}`).toBeGreaterThan(0);
          failedAt.push(`${n}: ${notOk.find((l) => ALLOWED[0].test(l) || ALLOWED[1].test(l)) ?? notOk[0]}`);
        } else expect(notOk, what).toEqual([]);
      }
      console.log(`${name}: out of descriptors at\n  ${failedAt.join('\n  ')}`);
      expect(failedAt.length, 'no limit of the sweep ran out').toBeGreaterThan(0);
      const roomy = await underLimit(1024, env);
      expect(roomy.stdout.split('\n').filter((l) => l.startsWith('not ok')), roomy.stderr.slice(-3000)).toEqual([]);
      expect(roomy.status).toBe(0);
    }, 400_000);
});
