// A process at its thread limit (a container's pids.max, RLIMIT_NPROC): every thread the
// plugin makes may fail to start. The C driver runs `tables` (TCP, 2 protocol threads) with
// test/driver/fail-threads.c preloaded, pthread_create failing from its Nth call on. Where the
// plugin makes the thread, init must fail with a WARN that says which thread could not start
// and the process must go on; std::thread's exception used to reach C or V8 (std::terminate:
// the host process gone). Node's own platform threads come right after the plugin thread: when
// one cannot start, Node aborts or waits forever, so init first checks that the plugin thread
// and those 3 can run at once. The calls are counted in a first run, so the test finds the
// plugin's threads by their order and checks that each WARN names the thread it expects.
import * as fs from 'fs';
import * as path from 'path';
import { execFileSync } from 'child_process';
import { beforeAll, describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const SRC = path.join(ROOT, 'test/driver/fail-threads.c');
const SO = path.join(ROOT, 'build/test/fail-threads.so');

function preload(): string {
  if (!fs.existsSync(SO) || fs.statSync(SO).mtimeMs < fs.statSync(SRC).mtimeMs) {
    fs.mkdirSync(path.dirname(SO), { recursive: true });
    execFileSync('cc', ['-shared', '-fPIC', '-O2', '-Wall', '-Werror', SRC, '-o', SO, '-ldl'], { stdio: 'pipe' });
  }
  return SO;
}

async function tables(env: Record<string, string>) {
  const r = await runAsync(buildDriver(), ['tables', '--version', '12', '--timeout', '10', '--lib', LIB], {
    cwd: ROOT,
    env: driverEnv({ TSNET_TRANSPORT: 'tcp', TSNET_PROTOCOL_THREADS: '2', LD_PRELOAD: preload(), ...env }),
    timeout: 60_000,
  });
  return { ...r, all: r.stdout + r.stderr };
}

describe('pthread_create failing from the Nth call on: init fails with a WARN, the process goes on', () => {
  let calls = 0;

  beforeAll(async () => {
    requireLib();
    const r = await tables({ TSNET_TEST_THREADS_COUNT: '1' });
    expect(r.status, r.all.slice(-3000)).toBe(0);
    calls = (r.stderr.match(/^fail-threads: pthread_create #\d+$/gm) ?? []).length;
    console.log(`driver tables (tcp, 2 protocol threads): ${calls} threads made`);
  }, 120_000);

  /** Runs tables with creation failing from n on: the driver's init check fails, no signal. */
  async function failFrom(n: number, warn: RegExp): Promise<string> {
    const r = await tables({ TSNET_TEST_FAIL_THREADS_FROM: String(n) });
    expect(r.signal, r.all.slice(-3000)).toBeNull();
    expect(r.all).not.toMatch(/terminate called|died of signal|node::Abort/);
    expect(r.stdout).toMatch(/^not ok - v12 tables: init \(rc [1-9]\)$/m);
    expect(r.status).toBe(1);
    const m = r.all.match(warn);
    expect(m, r.all.slice(-3000)).not.toBeNull();
    return m![0];
  }

  it('the first call: the plugin cannot have its thread and Node\'s 3', async () => {
    await failFrom(1, /NET\/tsnet cannot start the plugin: the process cannot run the 4 threads the plugin thread and Node's platform need \(Resource temporarily unavailable\)/);
  }, 60_000);

  it('the plugin thread itself (after the check)', async () => {
    await failFrom(5, /NET\/tsnet cannot start the plugin thread: Resource temporarily unavailable/);
  }, 60_000);

  it('each I/O thread, and protocol thread 1 before them', async () => {
    // The I/O threads are the last ones made; the last one's WARN says how many there are.
    const last = await failFrom(calls, /ioStart: cannot start I\/O thread (\d+) of (\d+): Resource temporarily unavailable/);
    const io = Number(/of (\d+)/.exec(last)![1]);
    expect(last).toContain(`I/O thread ${io - 1} of ${io}`);
    for (const k of [0, Math.floor(io / 2)])
      await failFrom(calls - io + 1 + k, new RegExp(`ioStart: cannot start I/O thread ${k} of ${io}: Resource temporarily unavailable`));
    await failFrom(calls - io, /startThreads: protocol thread 1: cannot start it: Resource temporarily unavailable/);
  }, 120_000);

  it('past the last one, tables passes', async () => {
    const r = await tables({ TSNET_TEST_FAIL_THREADS_FROM: String(calls + 1) });
    expect(r.status, r.all.slice(-3000)).toBe(0);
  }, 60_000);
});
