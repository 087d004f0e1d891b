// The C driver (test/driver/driver.c) against the built library, through the exported table
// versions: every scenario on the in-process loopback transport (v6..v12), and over the TCP
// transport the pair scenarios across two processes (v12, v11, v9), killpeer, stranger, and
// the one-process scenarios (v12). One vitest test per scenario x version x mode.
import { beforeAll, describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { LIB, ROOT, buildDriver, requireLib } from './build-driver';

const SCENARIOS = ['tables', 'transfer', 'inflight', 'grouped', 'marker', 'badinput', 'lifecycle'];
const VERSIONS = [6, 7, 8, 9, 10, 11, 12];
const LOOPBACK = { TSNET_TRANSPORT: 'loopback', TSNET_LOOPBACK_DEVICES: '2' };
const TCP = { TSNET_TRANSPORT: 'tcp' };

interface Run {
  status: number | null;
  signal: string | null;
  out: string;
  err: string;
  seconds: number;
}

async function runDriver(args: string[], env: Record<string, string>): Promise<Run> {
  const base = { ...process.env };
  // The TCP runs use the default device discovery, whatever the caller's shell had set.
  for (const k of ['TSNET_TRANSPORT', 'TSNET_LOOPBACK_DEVICES', 'TSNET_DEVICE_GROUPS', 'NCCL_SOCKET_IFNAME', 'NCCL_SOCKET_FAMILY'])
    delete base[k];
  const r = await runAsync(buildDriver(), [...args, '--lib', LIB], { cwd: ROOT, env: { ...base, ...env }, timeout: 600_000 });
  return { status: r.status, signal: r.signal, out: r.stdout, err: r.stderr, seconds: r.seconds };
}

/** Check lines of one scenario and version: `ok - v11 transfer [recv]: ...`. */
function linesOf(out: string, scenario: string, version: number): string[] {
  const re = new RegExp(`^(not ok|ok) - v${version} ${scenario}( \\[(send|recv)\\])?: `);
  return out.split('\n').filter((l) => re.test(l));
}

function expectClean(r: Run): void {
  const failed = r.out.split('\n').filter((l) => l.startsWith('not ok'));
  expect(failed, r.err.slice(-4000)).toEqual([]);
  expect(r.out).toMatch(/^\d+ passed, 0 failed$/m);
  expect(r.signal).toBeNull();
  expect(r.status).toBe(0);
}

function expectScenario(r: Run, scenario: string, version: number): void {
  const lines = linesOf(r.out, scenario, version);
  expect(lines.length, `no output for ${scenario} v${version}`).toBeGreaterThan(0);
  expect(lines.filter((l) => l.startsWith('not ok'))).toEqual([]);
}

describe('C driver, all scenarios, --procs 1, loopback', () => {
  let result: Run;

  beforeAll(async () => {
    requireLib();
    result = await runDriver(['all', '--procs', '1'], LOOPBACK);
  }, 600_000);

  it('exits 0 with no failed check', () => expectClean(result));

  for (const scenario of SCENARIOS)
    for (const version of VERSIONS) it(`${scenario} v${version}`, () => expectScenario(result, scenario, version));

  it('tables shows each device\'s guid, distinct per device and the same in every version\'s process', () => {
    const notes = (v: number) => [...result.out.matchAll(new RegExp(`^# v${v} tables: dev (\\d+): (\\S+) guid (0x[0-9a-f]{16})$`, 'gm'))].map((m) => m.slice(1));
    const v12 = notes(12);
    expect(v12.map(([dev, name]) => [dev, name])).toEqual([['0', 'tsnet-loop0'], ['1', 'tsnet-loop1']]);
    expect(new Set(v12.map(([, , guid]) => guid)).size).toBe(2);
    for (const v of VERSIONS) expect(notes(v)).toEqual(v12);
  });

  it('skips killpeer and stranger on loopback, saying why', () => {
    expect(result.out).toMatch(/^# v12 killpeer: skip: /m);
    expect(result.out).toMatch(/^# v12 stranger: skip: /m);
  });
});

describe('C driver, --procs 2, loopback', () => {
  // Loopback refuses handles from another process: this mode must fail as a reported check
  // (the sender's connect), never as a crash or a hang.
  it('reports loopback refusing a cross-process connect as a failed check, not a crash', async () => {
    requireLib();
    const r = await runDriver(['transfer', '--procs', '2', '--version', '11', '--timeout', '10'], LOOPBACK);
    expect(r.signal).toBeNull();
    expect(r.status).toBe(1);
    expect(r.out).toMatch(/^not ok - v11 transfer \[send\]: connect returned [1-9]\d*$/m);
    expect(r.out).toMatch(/^ok - v11 transfer: the sender process reported its results/m);
    expect(r.out).toMatch(/^ok - v11 transfer: the receiver process reported its results/m);
    expect(r.out).not.toMatch(/died of signal|did not exit|timed out/);
    expect(r.out).toMatch(/^\d+ passed, [1-9]\d* failed$/m);
  }, 120_000);
});

// Over TCP, `all --procs 2` runs transfer (0 B to 64 MiB), inflight (8, 32), grouped (n = 8, 4;
// 20 rounds), marker, badinput (a 16 KiB send into a 4 KiB receive) across two processes, and
// killpeer and stranger, which manage their own processes and sockets.
const TCP_PROCS2 = ['transfer', 'inflight', 'grouped', 'marker', 'badinput', 'killpeer', 'stranger'];

for (const version of [12, 11, 9])
  describe(`C driver, TCP, --procs 2, v${version}`, () => {
    let result: Run;

    beforeAll(async () => {
      requireLib();
      result = await runDriver(['all', '--procs', '2', '--version', String(version)], TCP);
      console.log(`driver all --procs 2 --version ${version} (tcp): ${result.seconds.toFixed(1)} s`);
    }, 600_000);

    it('exits 0 with no failed check', () => expectClean(result));

    for (const scenario of TCP_PROCS2) it(scenario, () => expectScenario(result, scenario, version));

    it('every role ran in its own process and reported', () => {
      for (const scenario of ['transfer', 'inflight', 'grouped', 'marker', 'badinput'])
        for (const role of ['sender', 'receiver'])
          expect(result.out).toMatch(new RegExp(`^ok - v${version} ${scenario}: the ${role} process reported its results`, 'm'));
    });

    it('carries 16 MiB + 5 and 64 MiB validated across processes', () => {
      for (const size of [(16 << 20) + 5, 64 << 20])
        expect(result.out).toMatch(new RegExp(`^ok - v${version} transfer \\[recv\\]: recv of ${size} bytes: data equal`, 'm'));
    });

    it('keeps 8 and 32 requests in flight', () => {
      for (const n of [8, 32])
        for (const what of ['sends', 'receives'])
          expect(result.out).toMatch(new RegExp(`^ok - v${version} inflight \\[(send|recv)\\]: all ${n} ${what} posted before testing any`, 'm'));
    });

    it('matches grouped receives n = 8 and n = 4 over 20 rounds', () => {
      for (const n of [8, 4])
        expect(result.out).toMatch(new RegExp(`^ok - v${version} grouped \\[send\\]: n=${n}: 20 rounds of ${n} sends in shuffled tag order completed`, 'm'));
      expect(result.out).toMatch(new RegExp(`^ok - v${version} grouped \\[recv\\]: n=4 round 19: `, 'm'));
    });

    // A send completes when its bytes are handed over (no round trip): the receiver's NACK fails
    // it if it is still pending, else the sender's next operation on the comm (driver.c over_step).
    it('fails both sides of an oversize send, guard bytes intact', () => {
      expect(result.out).toMatch(
        new RegExp(`^ok - v${version} badinput \\[send\\]: 16 KiB send into a 4 KiB receive: the sender's error surfaced \\(rc [1-9]\\d*\\) on (the send itself|a later send on the comm)$`, 'm'),
      );
      expect(result.out).toMatch(new RegExp(`^ok - v${version} badinput \\[recv\\]: 16 KiB send into a 4 KiB receive: the receive ends in an error`, 'm'));
      expect(result.out).toMatch(new RegExp(`^ok - v${version} badinput \\[recv\\]: 16 KiB send into a 4 KiB receive: nothing written past 4 KiB`, 'm'));
    });

    it('killpeer: a SIGKILLed sender, then receiver, fails the survivor within the budget', () => {
      for (const [victim, side] of [['sender', 'recv'], ['receiver', 'send']]) {
        expect(result.out).toMatch(new RegExp(`^ok - v${version} killpeer: the ${victim} was killed with SIGKILL mid-stream`, 'm'));
        expect(result.out).toMatch(new RegExp(`^ok - v${version} killpeer \\[${side}\\]: after the ${victim}'s SIGKILL test\\(\\) returned an error`, 'm'));
        expect(result.out).toMatch(new RegExp(`^ok - v${version} killpeer \\[${side}\\]: after the ${victim}'s SIGKILL every pending request ended`, 'm'));
      }
    });

    it('stranger: raw clients are dropped and never become comms; a real connection still works', () => {
      expect(result.out).toMatch(new RegExp(`^ok - v${version} stranger: accept over 1 s .* 0 comms, 0 errors$`, 'm'));
      expect(result.out.match(new RegExp(`^ok - v${version} stranger: the listener closed the stranger`, 'gm'))?.length).toBe(5);
      expect(result.out).toMatch(new RegExp(`^ok - v${version} stranger: transfer of 1048579 bytes after the strangers`, 'm'));
    });
  });

describe('C driver, TCP, --procs 1, v12', () => {
  let result: Run;

  beforeAll(async () => {
    requireLib();
    result = await runDriver([SCENARIOS.join(','), '--procs', '1', '--version', '12'], TCP);
    console.log(`driver ${SCENARIOS.join(',')} --procs 1 --version 12 (tcp): ${result.seconds.toFixed(1)} s`);
  }, 600_000);

  it('exits 0 with no failed check', () => expectClean(result));

  for (const scenario of SCENARIOS) it(scenario, () => expectScenario(result, scenario, 12));
});
