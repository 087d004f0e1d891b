// The libfabric layer (native/ofi/) against the real tcp;ofi_rxm and shm providers: builds
// test/ofi/ofi_test.cc with the layer's sources and runs one scenario per test. A provider that
// is not there skips its tests with the reason. FACT and BENCH lines (what the provider did,
// latency and bandwidth) are printed; docs/ofi-facts.md records them.
import { execFileSync, spawnSync } from 'child_process';
import { runAsync } from '../support/spawn';
import * as fs from 'fs';
import * as path from 'path';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(__dirname, '../..');
const OUT = path.join(ROOT, 'build/test');
const SOURCES = [
  ...fs.readdirSync(path.join(ROOT, 'native/ofi')).filter((f) => f.endsWith('.cc')).map((f) => path.join(ROOT, 'native/ofi', f)),
  path.join(ROOT, 'test/ofi/ofi_test.cc'),
];
const INPUTS = [...SOURCES, ...fs.readdirSync(path.join(ROOT, 'native/ofi')).map((f) => path.join(ROOT, 'native/ofi', f))];
// libfabric's headers, wherever the compiler finds them.
const haveHeaders = spawnSync('g++', ['-E', '-x', 'c++', '-'], { input: '#include <rdma/fabric.h>\n', stdio: 'pipe' }).status === 0;

// Builds the test program (again only when a source is newer), once per run. stub: without
// libfabric's headers. Both programs are started at once, and each source compiles to its own
// object, two compilers at a time (about 35 s of compiling, 17 s on two cores instead of 33).
const builds = new Map<boolean, Promise<string>>();
function build(stub: boolean): Promise<string> {
  let done = builds.get(stub);
  if (!done) builds.set(stub, (done = compile(stub)));
  return done;
}

// At most two compilers run at once, whichever program they build.
const JOBS = 2;
let running = 0;
const waiting: (() => void)[] = [];
async function job<T>(work: () => Promise<T>): Promise<T> {
  if (running >= JOBS) await new Promise<void>((go) => waiting.push(go));
  running++;
  try {
    return await work();
  } finally {
    running--;
    waiting.shift()?.();
  }
}

async function gxx(args: string[], what: string): Promise<void> {
  const r = await job(() => runAsync('nice', ['g++', ...args]));
  if (r.status !== 0) throw new Error(`building ${what} failed:\n${r.stderr.slice(-4000)}`);
}

async function compile(stub: boolean): Promise<string> {
  const bin = path.join(OUT, stub ? 'ofi_test_stub' : 'ofi_test');
  const built = fs.existsSync(bin) ? fs.statSync(bin).mtimeMs : 0;
  if (INPUTS.some((f) => fs.statSync(f).mtimeMs > built)) {
    const objDir = `${bin}.o`;
    fs.mkdirSync(objDir, { recursive: true });
    const flags = ['-std=c++17', '-O2', '-g', '-Wall', '-Wextra', '-Werror', '-Wno-unused-parameter', '-Wno-missing-field-initializers'];
    if (stub) flags.push('-DTSN_OFI_NO_LIBFABRIC');
    const objs = SOURCES.map((src) => path.join(objDir, `${path.basename(src)}.o`));
    await Promise.all(SOURCES.map((src, i) => gxx([...flags, '-I', path.join(ROOT, 'native'), '-c', src, '-o', objs[i]], objs[i])));
    await gxx([...objs, '-o', bin, '-ldl'], bin);
  }
  return bin;
}
build(true).catch(() => undefined);
if (haveHeaders) build(false).catch(() => undefined);

interface Run {
  out: string;
  status: number | null;
  signal: NodeJS.Signals | null;
}

async function run(bin: Promise<string>, args: string[], env: NodeJS.ProcessEnv = {}, timeout = 280_000): Promise<Run> {
  const r = await runAsync(await bin, args, { cwd: ROOT, timeout, env: { ...process.env, ...env } });
  return { out: r.stdout + r.stderr, status: r.status, signal: r.signal };
}

function expectPassed(r: Run, scenario: string): void {
  for (const line of r.out.split('\n').filter((l) => /^(FACT|BENCH)/.test(l))) console.log(line);
  const failed = r.out.split('\n').filter((l) => /^FAIL/.test(l));
  expect(failed, r.out.slice(-4000)).toEqual([]);
  expect(r.out, r.out.slice(-4000)).toMatch(new RegExp(`DONE \\S+ ${scenario}: 0 failure`));
  expect(r.signal).toBeNull();
  expect(r.status).toBe(0);
}

describe('the libfabric layer, built without libfabric headers', () => {
  it('reports why the ofi transport cannot start', async () => {
    const r = await run(build(true), ['--provider', 'tcp', '--scenario', 'discover']);
    expect(r.out).toMatch(/SKIP tcp: tsnet was built without libfabric's headers/);
    expect(r.status).toBe(0);
  });
});

describe.skipIf(!haveHeaders)('the libfabric layer (native/ofi)', () => {
  it('fails cleanly when libfabric cannot be opened (TSNET_LIBFABRIC)', async () => {
    const r = await run(build(false), ['--provider', 'tcp', '--scenario', 'discover'], { TSNET_LIBFABRIC: '/nonexistent/libfabric.so.1' });
    expect(r.out).toMatch(/SKIP tcp: cannot open \/nonexistent\/libfabric\.so\.1 \(TSNET_LIBFABRIC\)/);
    expect(r.status).toBe(0);
  });

  for (const provider of ['tcp', 'shm']) {
    describe(`FI_PROVIDER=${provider}`, () => {
      for (const scenario of ['discover', 'inproc', 'fork', 'death', 'signals', 'dmabuf', 'gpu', 'gpu-fork']) {
        it(scenario, async (ctx) => {
          const r = await run(build(false), ['--provider', provider, '--scenario', scenario], { FI_PROVIDER: provider });
          const skip = r.out.match(/^SKIP .*$/m);
          if (skip) {
            console.log(skip[0]);
            ctx.skip();
            return;
          }
          expectPassed(r, scenario);
        }, 300_000);
      }
    });
  }

  it('the built library does not link libfabric (it is opened at run time)', (ctx) => {
    const lib = path.join(ROOT, 'build/libnccl-net-tsnet.so');
    if (!fs.existsSync(lib)) {
      console.log('build/libnccl-net-tsnet.so missing; run `npm run build` first');
      ctx.skip();
      return;
    }
    const dynamic = execFileSync('readelf', ['-d', lib], { encoding: 'utf8' });
    expect(dynamic).not.toMatch(/NEEDED.*libfabric/);
    const undefinedSyms = execFileSync('nm', ['-D', '--undefined-only', lib], { encoding: 'utf8' });
    expect(undefinedSyms).not.toMatch(/\bfi_\w+/);
  });
});
