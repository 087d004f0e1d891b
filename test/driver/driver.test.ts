// The C driver (test/driver/driver.c) against the built library, through the exported table
// versions: every scenario on the in-process loopback transport (v6..v12), and over the TCP
// transport the pair scenarios across two processes (v12, v11, v9), killpeer, stranger,
// teardown with 1 and 4 protocol threads, the one-process scenarios (v12; fork among them),
// and the gpu scenario's skip where there is no CUDA memory. One vitest test per scenario x
// version x mode.
import { beforeAll, describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const SCENARIOS = ['tables', 'transfer', 'inflight', 'grouped', 'pushback', 'teardown', 'marker', 'peerclose', 'badinput', 'lifecycle', 'fork', 'stale'];
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
  // The TCP runs use the default device discovery, whatever the caller's shell had set.
  const r = await runAsync(buildDriver(), [...args, '--lib', LIB], { cwd: ROOT, env: driverEnv(env), timeout: 600_000 });
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

// The gpu scenario needs a device with CUDA memory (libfabric with FI_HMEM and CUDA, on a GPU
// host). Elsewhere both roles must skip it, saying why, and still connect and close cleanly.
describe('C driver, gpu scenario without CUDA memory', () => {
  it('TCP: both roles skip with the reason; the pair connects and closes cleanly', async () => {
    requireLib();
    const r = await runDriver(['gpu', '--procs', '2', '--timeout', '10'], TCP);
    expectClean(r);
    for (const role of ['send', 'recv'])
      expect(r.out).toMatch(new RegExp(`^# v12 gpu \\[${role}\\]: skip: device 0's ptrSupport 0x1 has no CUDA`, 'm'));
    expect(r.out).toMatch(/^ok - v12 gpu \[send\]: closeSend \(rc 0\)$/m);
    expect(r.out).toMatch(/^ok - v12 gpu \[recv\]: closeRecv \(rc 0\)$/m);
  }, 120_000);
});

// Over TCP, `all --procs 2` runs transfer (0 B to 64 MiB), inflight (8, 32), grouped (n = 8, 4;
// 20 rounds), pushback (tags pushed back to later receives), teardown (deregMr and close under
// load, 5 cycles), marker, peerclose (the receiver closes with sends waiting), badinput (a 16 KiB
// send into a 4 KiB receive) across two processes, and killpeer and stranger, which manage their
// own processes and sockets.
const PAIRS = ['transfer', 'inflight', 'grouped', 'pushback', 'teardown', 'marker', 'peerclose', 'badinput'];
const TCP_PROCS2 = [...PAIRS, 'killpeer', 'stranger'];
const PUSHBACK_PATTERNS = ['a', 'b2', 'b3', 'c'];

/** pushback: every pattern, in both posting orders, matched by the rule and validated. */
function expectPushback(out: string, version: number): void {
  for (const order of ['receiver first', 'sender first'])
    for (const p of PUSHBACK_PATTERNS) {
      const head = `^ok - v${version} pushback \\[(send|recv)\\]: ${p}: .* \\(${order}\\): `;
      expect(out).toMatch(new RegExp(`${head.replace('(send|recv)', 'recv')}\\d+ receives got each message by the rule \\(\\d+ eager-size, \\d+ striped\\)`, 'm'));
      expect(out).toMatch(new RegExp(`${head.replace('(send|recv)', 'send')}\\d+ sends completed`, 'm'));
    }
}

/** teardown: both sides tore down under load 5 times, with every call's code checked, and reconnected. */
function expectTeardown(out: string, version: number, checkFds: boolean): void {
  for (const side of ['receiver', 'sender']) {
    const role = side === 'sender' ? 'send' : 'recv';
    const other = side === 'sender' ? 'recv' : 'send';
    expect(out).toMatch(new RegExp(`^ok - v${version} teardown \\[${role}\\]: 5 cycles: torn down by the ${side} with \\d+ load requests in flight`, 'm'));
    expect(out).toMatch(new RegExp(`^ok - v${version} teardown \\[${other}\\]: 5 cycles: followed the ${side}'s teardown`, 'm'));
    for (let c = 0; c < 5; c++)
      expect(out).toMatch(new RegExp(`^ok - v${version} teardown \\[${role}\\]: cycle ${c}: the ${side} tears down with [1-9]\\d* load`, 'm'));
  }
  for (const what of ['deregMr with \\d+ \\w+\\(s\\) in flight returns 0', '(closeSend|closeRecv) returns 0', 'test\\(\\) on \\w+ #\\d+ of the closed comm returns an error'])
    expect(out.match(new RegExp(`^ok - v${version} teardown \\[(send|recv)\\]: cycle \\d: ${what}`, 'gm'))?.length).toBe(20);
  expect(out.match(new RegExp(`^ok - v${version} teardown \\[recv\\]: cycle \\d: closeListen returns 0`, 'gm'))?.length).toBe(10);
  expect(out.match(new RegExp(`^ok - v${version} teardown \\[recv\\]: cycle \\d: reconnected; .* validated`, 'gm'))?.length).toBe(10);
  if (checkFds) expect(out.match(new RegExp(`^ok - v${version} teardown \\[(send|recv)\\]: open descriptors after each cycle: `, 'gm'))?.length).toBe(4);
}

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
      for (const scenario of PAIRS)
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

    it('pushback: tags pushed back to later receives, eager and striped, both posting orders', () => expectPushback(result.out, version));

    it('teardown: deregMr and close under load by either side return 0, stale tests fail, reconnects carry data, descriptors stay', () =>
      expectTeardown(result.out, version, true));

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

// teardown again with the protocol threads set: 1, and 4 (each new listener and connection on
// another thread, every thread's first use in the cycles).
describe('C driver, TCP, --procs 2, v12, teardown with TSNET_PROTOCOL_THREADS', () => {
  for (const threads of [1, 4])
    it(`${threads} protocol thread(s)`, async () => {
      requireLib();
      const r = await runDriver(['teardown', '--procs', '2', '--version', '12'], { ...TCP, TSNET_PROTOCOL_THREADS: String(threads) });
      console.log(`driver teardown --procs 2 --version 12 (tcp, ${threads} protocol threads): ${r.seconds.toFixed(1)} s`);
      expectClean(r);
      expect(r.out).toMatch(new RegExp(`^# v12 teardown \\[recv\\]: teardown by the receiver; TSNET_PROTOCOL_THREADS=${threads}$`, 'm'));
      expectTeardown(r.out, 12, true);
    }, 120_000);
});

// TSNET_STATS through the .so: without a busy-poll window every hand-over between threads is a
// wake-up, and each process reports how late its protocol thread and its I/O threads took them.
describe('C driver, TCP, --procs 2, v12, TSNET_STATS', () => {
  it('each process reports the wake-ups of protocol thread 0 and of its I/O threads, with their delays, and what its connects and accepts cost', async () => {
    requireLib();
    const r = await runDriver(['transfer', '--procs', '2', '--version', '12', '--verbose'], { ...TCP, TSNET_STATS: '1', TSNET_SPIN_US: '0' });
    expectClean(r);
    const q = '(< \\d+|>= \\d+) us';
    const line = (who: string) =>
      new RegExp(`^\\[(\\d+)\\].*NET/tsnet stats: wake-ups of ${who}: (\\d+), mean [\\d.]+ us, median ${q}, p99 ${q}, max \\d+ us$`, 'gm');
    const proto = [...r.err.matchAll(line('protocol thread 0'))];
    const io = [...r.err.matchAll(line('\\d+ I/O thread\\(s\\)'))];
    expect(new Set(proto.map((m) => m[1])).size, r.err.slice(-3000)).toBe(2); // both processes
    expect(new Set(io.map((m) => m[1])).size).toBe(2);
    for (const m of [...proto, ...io]) expect(Number(m[2])).toBeGreaterThan(0);
    // and what its connects and accepts cost it: the sender connected, the receiver accepted
    // (TCP times the handshakes of both), both calling again until the comm was up
    const connects = [...r.err.matchAll(new RegExp(`^\\[(\\d+)\\].*NET/tsnet stats: protocol thread 0: connects: (\\d+) comm\\(s\\) up, first call to comm median ${q}, p99 ${q}, max \\d+ us; first call to ready median ${q}, p99 ${q}, max \\d+ us; ready to connected median ${q}, p99 ${q}, max \\d+ us; (\\d+) call\\(s\\), [\\d.]+ ms in them$`, 'gm'))];
    const accepts = [...r.err.matchAll(new RegExp(`^\\[(\\d+)\\].*NET/tsnet stats: protocol thread 0: accepts: (\\d+) comm\\(s\\) up; first message to ready median ${q}, p99 ${q}, max \\d+ us; ready to accepted median ${q}, p99 ${q}, max \\d+ us; (\\d+) call\\(s\\), [\\d.]+ ms in them$`, 'gm'))];
    expect(connects.length, r.err.slice(-3000)).toBe(1);
    expect(accepts.length, r.err.slice(-3000)).toBe(1);
    expect(connects[0][1]).not.toBe(accepts[0][1]);
    for (const m of [...connects, ...accepts]) {
      expect(Number(m[2])).toBeGreaterThan(0);
      expect(Number(m[m.length - 1])).toBeGreaterThanOrEqual(Number(m[2])); // a call per comm at least
    }
    // and how long the driver's threads waited for each kind of control call, counted in C
    const part = (call: string) => `${call} (\\d+), waited ([\\d.]+) ms \\(ran ([\\d.]+), longest ([\\d.]+)\\)`;
    const calls = [...r.err.matchAll(/^\[(\d+)\].*NET\/tsnet stats: protocol thread 0: control calls as NCCL's threads waited for them: (.*)$/gm)];
    expect(new Set(calls.map((m) => m[1])).size, r.err.slice(-3000)).toBe(2);
    const sender = calls.find((m) => m[1] === connects[0][1])![2];
    const receiver = calls.find((m) => m[1] === accepts[0][1])![2];
    const c = sender.match(new RegExp(part('connect')));
    const a = receiver.match(new RegExp(part('accept')));
    expect(c, sender).not.toBeNull();
    expect(a, receiver).not.toBeNull();
    expect(Number(c![1])).toBe(Number(connects[0][connects[0].length - 1])); // the calls JavaScript counted
    expect(Number(a![1])).toBe(Number(accepts[0][accepts[0].length - 1]));
    for (const m of [c!, a!]) expect(Number(m[2])).toBeGreaterThanOrEqual(Number(m[3])); // a wait holds the call's run
    expect(receiver).toMatch(new RegExp(part('listen')));
    expect(sender).toMatch(new RegExp(part('regMr')));
    // The driver gives setNetAttr the same hints three times, then others: two reach the plugin.
    for (const side of [sender, receiver]) expect(side.match(new RegExp(part('setNetAttr')))?.[1], side).toBe('2');
  }, 120_000);

  it('TSNET_CONNECT_EARLY=1: the transfer passes, and each connect gives its comm in one call, before the ACKs; its handshake is still timed', async () => {
    requireLib();
    const r = await runDriver(['transfer', '--procs', '2', '--version', '12', '--verbose'], { ...TCP, TSNET_STATS: '1', TSNET_CONNECT_EARLY: '1' });
    expectClean(r);
    const q = '(< \\d+|>= \\d+) us';
    const connects = [...r.err.matchAll(new RegExp(`^\\[(\\d+)\\].*NET/tsnet stats: protocol thread 0: connects: (\\d+) comm\\(s\\) up, first call to comm median ${q}, p99 ${q}, max \\d+ us; first call to ready median ${q}, p99 ${q}, max \\d+ us; ready to connected -; (\\d+) given before ready; (\\d+) call\\(s\\), [\\d.]+ ms in them$`, 'gm'))];
    expect(connects.length, r.err.slice(-3000)).toBe(1);
    const m = connects[0];
    const [up, early, calls] = [Number(m[2]), Number(m[m.length - 2]), Number(m[m.length - 1])];
    expect(up).toBeGreaterThan(0);
    expect(early).toBe(up); // over loopback every socket connects and greets within the first call
    expect(calls).toBe(up);
    expect(r.err).toMatch(/TCP connects give their comm before the ACKs = on \(TSNET_CONNECT_EARLY\)/);
  }, 120_000);

  it('TSNET_STATS=steps: the sender reports where its sends spent their time, the receiver its receives, the I/O threads\' steps included', async () => {
    requireLib();
    const r = await runDriver(['transfer', '--procs', '2', '--version', '12', '--verbose'], { ...TCP, TSNET_STATS: 'steps' });
    expectClean(r);
    const us = '[\\d.]+ / [\\d.]+( \\(\\d+\\))?';
    // A step the turn made itself comes before `in JS→handled`: a frame written here, or a
    // receive whose eager message was there already (`in JS→landed`).
    const line = (op: string, steps: string) =>
      new RegExp(`^\\[(\\d+)\\].*NET/tsnet stats: steps of ${op} on protocol thread \\d+, (\\d+) requests, median / p99 us: posted→picked up ${us}; picked up→in JS ${us}; (in JS→(?!handled)[^;]+ ${us}; )?in JS→handled ${us}; handled→polled ${us}; polled→submitted ${us}; ${steps}.*; posted→done ${us}$`, 'gm');
    const sends = [...r.err.matchAll(line('isend', `submitted→written ${us}; (.*; )?written→done ${us}`))];
    const recvs = [...r.err.matchAll(line('irecv', `submitted→landed ${us}; (.*; )?landed→done ${us}`))];
    // one process sends, the other receives
    expect(sends.length, r.err.slice(-3000)).toBeGreaterThan(0);
    expect(recvs.length, r.err.slice(-3000)).toBeGreaterThan(0);
    expect(new Set([...sends, ...recvs].map((m) => m[1])).size).toBe(2);
    for (const m of [...sends, ...recvs]) expect(Number(m[2])).toBeGreaterThan(0);
    // Its small messages went one at a time: the protocol thread wrote their frames itself.
    expect(sends.some((m) => m[0].includes('; in JS→written here ') && m[0].includes('; written here→done ')), sends.map((m) => m[0]).join('\n')).toBe(true);
  }, 120_000);
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

  // A training job's data loader forks after NCCL started: the child has the plugin's memory
  // but none of its threads. Its calls fail at once with a WARN naming the call (a request
  // posted there would never complete), and it exits through exit() without disturbing the parent.
  it('fork: every call of the child fails at once with a WARN naming it; the parent goes on', () => {
    for (const call of ['isend', 'irecv', 'test', 'regMr', 'listen', 'closeListen', 'init'])
      expect(result.err).toMatch(new RegExp(`v12 fork \\[child\\]: log 2: NET/tsnet ${call}: this process \\(\\d+\\) was forked from process \\d+ after the plugin started there`));
    expect(result.out).toMatch(/^ok - v12 fork: the forked child returned from every call, reported, and exited through exit\(\) with 0/m);
    expect(result.out).toMatch(/^ok - v12 fork: after the child's exit, into the receive posted before the fork: 1048576 bytes/m);
    expect(result.out).toMatch(/^ok - v12 fork: a new pair after the child's exit: 1048576 bytes/m);
  });
});
