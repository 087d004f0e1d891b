// The C driver against the plugin built under AddressSanitizer (cmake target
// nccl-net-tsnet-asan, into build/asan/; the driver's processes preload gcc's libasan): the
// native core, the embedding, the engine and the libfabric layer, with uses of freed memory
// and overflows reported at once instead of crashing sometimes. libnode is not instrumented.
// Over TCP across two processes (the pair scenarios, teardown with 4 protocol threads) and
// over libfabric's shm; on loopback in one process (it found Regions.find's overlap bug); and
// the warm-up at init (TSNET_WARMUP) over TCP and shm.
import { execFileSync } from 'child_process';
import * as path from 'path';
import { beforeAll, describe, expect, it } from 'vitest';
import { libasan } from '../support/asan';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const ASAN = libasan();
const LIB = path.join(ROOT, 'build/asan/libnccl-net-tsnet.so');
if (!ASAN) console.log('skipping the driver under AddressSanitizer: gcc has no libasan.so');

async function run(args: string[], env: Record<string, string>) {
  const r = await runAsync(buildDriver(), [...args, '--lib', LIB], {
    cwd: ROOT,
    // The library finds its JavaScript beside it or in ../dist; build/asan has neither.
    env: driverEnv({ LD_PRELOAD: ASAN!, ASAN_OPTIONS: 'detect_leaks=0', TSNET_JS_ENTRY: path.join(ROOT, 'dist/plugin/index.js'), ...env }),
    timeout: 300_000,
  });
  console.log(`driver ${args.join(' ')} under AddressSanitizer (${env.TSNET_TRANSPORT}${env.FI_PROVIDER ? ` ${env.FI_PROVIDER}` : ''}): ${r.seconds.toFixed(1)} s`);
  return r;
}

function expectClean(r: Awaited<ReturnType<typeof run>>): void {
  const asan = r.stderr.indexOf('AddressSanitizer');
  expect(asan, asan >= 0 ? r.stderr.slice(Math.max(0, asan - 200), asan + 5000) : '').toBe(-1);
  expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), r.stderr.slice(-3000)).toEqual([]);
  expect(r.stdout).toMatch(/^\d+ passed, 0 failed$/m);
  expect(r.status).toBe(0);
}

describe.skipIf(!ASAN)('C driver, plugin under AddressSanitizer', () => {
  beforeAll(() => {
    requireLib();
    execFileSync('cmake', ['--build', 'build', '--target', 'nccl-net-tsnet-asan'], { cwd: ROOT, stdio: 'pipe' });
  }, 600_000);

  it('TCP, --procs 2, v12: the pair scenarios, killpeer and stranger', async () => {
    expectClean(await run(['transfer,inflight,grouped,pushback,teardown,marker,badinput,killpeer,stranger', '--procs', '2'], { TSNET_TRANSPORT: 'tcp' }));
  }, 400_000);

  it('TCP, --procs 2, v9, teardown with 4 protocol threads', async () => {
    expectClean(await run(['teardown', '--procs', '2', '--version', '9'], { TSNET_TRANSPORT: 'tcp', TSNET_PROTOCOL_THREADS: '4' }));
  }, 400_000);

  it('TCP and libfabric shm, --procs 2, v12, 2 protocol threads: the warm-up at init', async () => {
    for (const env of [{ TSNET_TRANSPORT: 'tcp' }, ...(HAVE_LIBFABRIC ? [{ TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm' }] : [])]) {
      const r = await run(['transfer', '--procs', '2', '--verbose'], { ...env, TSNET_WARMUP: '200', TSNET_PROTOCOL_THREADS: '2' });
      expectClean(r);
      expect(r.stderr.match(/NET\/tsnet warm-up: \d+ of 200 message\(s\)/g)).toHaveLength(2);
    }
  }, 400_000);

  // Every scenario of `all` but fork on v12, and on every version the scenarios that go through
  // each of a version's adapters (tsnet_tables.c: properties, connect and accept, registration,
  // single and grouped sends and receives, test, the request marker, bad arguments, closes): the
  // other scenarios differ from these only in the core, which is the same whatever the version
  // (every version ran every scenario here until the run took 49 s of the 2-core CI machine's
  // 15 minutes; driver.test.ts still runs every scenario on every version without ASan).
  // gcc 12's libasan takes none of its allocator's locks around fork() (it registers no
  // pthread_atfork handler): a child forked while one of the plugin's or Node's threads is
  // inside ASan's malloc inherits that lock held and hangs in its own first malloc (a CI run saw
  // the v8 child hang so). glibc's malloc does take its locks across fork, so fork runs without
  // ASan in driver.test.ts and ofi.test.ts.
  it('loopback, --procs 1: every scenario but fork on v12, the adapters\' scenarios on every version', async () => {
    const loopback = { TSNET_TRANSPORT: 'loopback', TSNET_LOOPBACK_DEVICES: '2' };
    const all = 'tables,transfer,inflight,grouped,pushback,teardown,marker,peerclose,badinput,lifecycle,stale,killpeer,stranger';
    const v12 = await run([all, '--procs', '1', '--version', '12'], loopback);
    expectClean(v12);
    expect(v12.stdout).toMatch(/^ok - v12 stale: /m);
    const every = await run(['tables,transfer,grouped,marker,badinput', '--procs', '1', '--version', 'all'], loopback);
    expectClean(every);
    for (const v of [6, 7, 8, 9, 10, 11, 12]) expect(every.stdout).toMatch(new RegExp(`^ok - v${v} grouped \\[recv\\]: `, 'm'));
  }, 400_000);

  it.skipIf(!HAVE_LIBFABRIC)('libfabric shm, --procs 2, v12, 2 rails: transfer, in flight, grouped, the oversize send, killpeer', async () => {
    expectClean(
      await run(['transfer,inflight,grouped,badinput,killpeer', '--procs', '2'], {
        TSNET_TRANSPORT: 'ofi',
        FI_PROVIDER: 'shm',
        OFI_NCCL_FORCE_NUM_RAILS: '2',
        TSNET_TIMEOUT_SEC: '3',
      }),
    );
  }, 400_000);
});
