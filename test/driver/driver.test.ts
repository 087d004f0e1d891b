// The C driver (test/driver/driver.c) against the built library, through every table version,
// on the in-process loopback transport. One vitest test per scenario x version.
import { execFileSync, spawnSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { beforeAll, describe, expect, it } from 'vitest';

const ROOT = path.resolve(__dirname, '../..');
const LIB = path.join(ROOT, 'build/libnccl-net-tsnet.so');
const BIN = path.join(ROOT, 'build/test/driver');
const SOURCES = ['test/driver/driver.c', 'test/driver/shim.c'].map((s) => path.join(ROOT, s));
const DEPS = [...SOURCES, path.join(ROOT, 'test/driver/shim.h'), path.join(ROOT, 'native/generated/tsnet_abi.h')];
const SCENARIOS = ['tables', 'transfer', 'inflight', 'grouped', 'marker', 'badinput', 'lifecycle'];
const VERSIONS = [6, 7, 8, 9, 10, 11, 12];
const ENV = { ...process.env, TSNET_TRANSPORT: 'loopback', TSNET_LOOPBACK_DEVICES: '2' };

/** Builds build/test/driver when it is missing or older than a source. */
function buildDriver(): string {
  const built = fs.existsSync(BIN) ? fs.statSync(BIN).mtimeMs : 0;
  if (DEPS.some((d) => fs.statSync(d).mtimeMs > built)) {
    fs.mkdirSync(path.dirname(BIN), { recursive: true });
    execFileSync(
      'cc',
      ['-std=c11', '-O2', '-Wall', '-Wextra', '-Werror', '-I', path.join(ROOT, 'native/generated'), ...SOURCES, '-o', BIN, '-ldl'],
      { stdio: 'pipe' },
    );
  }
  return BIN;
}

function runDriver(args: string[]): { status: number | null; signal: string | null; out: string; err: string } {
  const r = spawnSync(buildDriver(), [...args, '--lib', LIB], { cwd: ROOT, env: ENV, encoding: 'utf8', timeout: 600_000 });
  return { status: r.status, signal: r.signal, out: r.stdout ?? '', err: r.stderr ?? '' };
}

/** Check lines of one scenario and version: `ok - v11 transfer [recv]: ...`. */
function linesOf(out: string, scenario: string, version: number): string[] {
  const re = new RegExp(`^(not ok|ok) - v${version} ${scenario}( \\[(send|recv)\\])?: `);
  return out.split('\n').filter((l) => re.test(l));
}

describe('C driver, all scenarios, --procs 1, loopback', () => {
  let result: ReturnType<typeof runDriver>;

  beforeAll(() => {
    if (!fs.existsSync(LIB)) throw new Error(`${LIB} is missing: run \`npm run build\` first`);
    result = runDriver(['all', '--procs', '1']);
  }, 600_000);

  it('exits 0 with no failed check', () => {
    const failed = result.out.split('\n').filter((l) => l.startsWith('not ok'));
    expect(failed, result.err.slice(-4000)).toEqual([]);
    expect(result.out).toMatch(/^\d+ passed, 0 failed$/m);
    expect(result.signal).toBeNull();
    expect(result.status).toBe(0);
  });

  for (const scenario of SCENARIOS)
    for (const version of VERSIONS)
      it(`${scenario} v${version}`, () => {
        const lines = linesOf(result.out, scenario, version);
        expect(lines.length, `no output for ${scenario} v${version}`).toBeGreaterThan(0);
        expect(lines.filter((l) => l.startsWith('not ok'))).toEqual([]);
      });
});

describe('C driver, --procs 2', () => {
  // Loopback refuses handles from another process, so this mode can only fail here; it must
  // fail as a reported check (the sender's connect), never as a crash or a hang. Once the TCP
  // transport exists, `driver all --procs 2` without TSNET_TRANSPORT runs these for real.
  it('reports loopback refusing a cross-process connect as a failed check, not a crash', () => {
    if (!fs.existsSync(LIB)) throw new Error(`${LIB} is missing: run \`npm run build\` first`);
    const r = runDriver(['transfer', '--procs', '2', '--version', '11', '--timeout', '10']);
    expect(r.signal).toBeNull();
    expect(r.status).toBe(1);
    expect(r.out).toMatch(/^not ok - v11 transfer \[send\]: connect returned [1-9]\d*$/m);
    expect(r.out).toMatch(/^ok - v11 transfer: the sender process reported its results/m);
    expect(r.out).toMatch(/^ok - v11 transfer: the receiver process reported its results/m);
    expect(r.out).not.toMatch(/died of signal|did not exit|timed out/);
    expect(r.out).toMatch(/^\d+ passed, [1-9]\d* failed$/m);
  }, 120_000);
});
