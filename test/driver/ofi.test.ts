// The C driver through the libfabric transport (TSNET_TRANSPORT=ofi) with both providers of
// Debian's libfabric that give FI_EP_RDM with RMA and remote CQ data: tcp;ofi_rxm and shm. The
// pair scenarios across two processes (transfer to 64 MiB, 8 and 32 in flight, grouped
// receives, messages pushed back to later receives by their tags, teardown under load and
// reconnects, the 0x1 marker, an oversize send, a killed peer) and the one-process scenarios
// (tables, bad input, lifecycles). TSNET_TIMEOUT_SEC is short so that silence is seen quickly:
// libfabric tells of a dead peer by silence (docs/rdma-protocol.md), except that tsnet looks
// the process of a peer on this host up. Skipped, saying so, where libfabric is not installed.
import { beforeAll, describe, expect, it } from 'vitest';
import { type Ran, runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, requireLib } from './build-driver';

const PAIR = ['transfer', 'inflight', 'grouped', 'pushback', 'teardown', 'marker', 'peerclose', 'badinput', 'killpeer'];
const ONE = ['tables', 'transfer', 'inflight', 'grouped', 'marker', 'peerclose', 'badinput', 'lifecycle', 'fork', 'stale'];

interface Run {
  out: string;
  err: string;
  status: number | null;
  seconds: number;
}

async function run(args: string[], provider: string, extra: NodeJS.ProcessEnv = {}): Promise<Run> {
  const env: NodeJS.ProcessEnv = { ...process.env, TSNET_TRANSPORT: 'ofi', FI_PROVIDER: provider, TSNET_TIMEOUT_SEC: '3', ...extra };
  delete env.TSNET_DEVICE_GROUPS;
  const r = await runAsync(buildDriver(), [...args, '--lib', LIB], { cwd: ROOT, env, timeout: 600_000 });
  return { out: r.stdout, err: r.stderr, status: r.status, seconds: r.seconds };
}

/** What to show when a run failed: its WARN lines (wherever they are in its log), then the log's end. */
function why(err: string): string {
  const warns = err.split('\n').filter((l) => / log 2: /.test(l));
  return `${warns.slice(0, 30).join('\n')}\n...\n${err.slice(-3000)}`;
}

function expectScenario(out: string, scenario: string): void {
  const re = new RegExp(`^(not ok|ok) - v12 ${scenario}( \\[(send|recv)\\])?: `);
  const lines = out.split('\n').filter((l) => re.test(l));
  expect(lines.length, `no output for ${scenario}`).toBeGreaterThan(0);
  expect(lines.filter((l) => l.startsWith('not ok'))).toEqual([]);
}

for (const provider of ['tcp', 'shm'])
  describe.skipIf(!HAVE_LIBFABRIC)(`C driver, libfabric ${provider}`, () => {
    let pair: Run;
    let one: Run;

    beforeAll(async () => {
      requireLib();
      pair = await run(['all', '--procs', '2', '--version', '12'], provider);
      one = await run([ONE.join(','), '--procs', '1', '--version', '12'], provider);
      console.log(`driver over ofi ${provider}: --procs 2 ${pair.seconds.toFixed(1)} s, --procs 1 ${one.seconds.toFixed(1)} s`);
    }, 600_000);

    it('--procs 2: exits 0 with no failed check', () => {
      expect(pair.out.split('\n').filter((l) => l.startsWith('not ok')), why(pair.err)).toEqual([]);
      expect(pair.status).toBe(0);
    });

    for (const scenario of PAIR)
      it(`--procs 2: ${scenario}`, () => expectScenario(pair.out, scenario));

    it('--procs 2: carries 64 MiB validated and a killed peer fails the survivor', () => {
      expect(pair.out).toMatch(new RegExp(`^ok - v12 transfer \\[recv\\]: recv of ${64 << 20} bytes: data equal`, 'm'));
      expect(pair.out).toMatch(/^ok - v12 killpeer \[recv\]: after the sender's SIGKILL test\(\) returned an error/m);
      expect(pair.out).toMatch(/^ok - v12 killpeer \[send\]: after the receiver's SIGKILL test\(\) returned an error/m);
    });

    // Both processes run on this host (the same boot id), so the survivor looks the killed
    // process up (plugin/transports/ofi/peer-process.ts) rather than waiting out
    // TSNET_TIMEOUT_SEC. Over tcp the provider may fail the sender's writes first.
    it('--procs 2: killpeer: the survivor fails its comm because the peer process exited', () => {
      const both = pair.out + pair.err;
      const name = provider === 'shm' ? 'shm' : '\\S+';
      expect(both).toMatch(new RegExp(`killpeer \\[recv\\]: log 2: NET/tsnet ofi ${name} recv comm \\d+: the peer's process \\d+ has exited`));
      if (provider === 'shm') expect(both).toMatch(/killpeer \[send\]: log 2: NET\/tsnet ofi shm send comm \d+: the peer's process \d+ has exited/);
    });

    it('--procs 2: pushback matches by the rule in both posting orders', () => {
      for (const order of ['receiver first', 'sender first'])
        for (const p of ['a', 'b2', 'b3', 'c'])
          expect(pair.out).toMatch(new RegExp(`^ok - v12 pushback \\[recv\\]: ${p}: .* \\(${order}\\): \\d+ receives got each message by the rule`, 'm'));
    });

    it('--procs 2: teardown by either side returns 0 and reconnects 5 times', () => {
      for (const side of ['receiver', 'sender']) {
        expect(pair.out).toMatch(new RegExp(`^ok - v12 teardown \\[(send|recv)\\]: 5 cycles: torn down by the ${side} with [1-9]\\d* load requests in flight`, 'm'));
        expect(pair.out).toMatch(new RegExp(`^ok - v12 teardown \\[(send|recv)\\]: 5 cycles: followed the ${side}'s teardown`, 'm'));
      }
      expect(pair.out.match(/^ok - v12 teardown \[(send|recv)\]: open descriptors after each cycle: /gm)?.length).toBe(4);
    });

    // A child forked with comms open fails its calls and exits through exit(), libfabric's
    // destructor included; the parent's comms, its receive in flight and (shm) its region stay.
    it('--procs 1: fork: the child\'s calls fail, its exit leaves the parent\'s comms working', () => {
      expect(one.out).toMatch(/^ok - v12 fork: the forked child returned from every call, reported, and exited through exit\(\) with 0/m);
      expect(one.out).toMatch(/^ok - v12 fork: after the child's exit, into the receive posted before the fork: 1048576 bytes/m);
      expect(one.out).toMatch(/^ok - v12 fork: a new pair after the child's exit: 1048576 bytes/m);
      if (provider === 'shm') expect(one.out).toMatch(/^ok - v12 fork: the libfabric shm region \S+ is still in \/dev\/shm after the child's exit$/m);
      // The child's exit ran the library's destructors: the parent's doorbells stay.
      if (provider === 'shm') expect(one.out).toMatch(/^ok - v12 fork: the [1-9]\d* doorbell\(s\) of this process are still in \/dev\/shm after the child's exit$/m);
    });

    it.runIf(provider === 'shm')('--procs 2: after the last finalize no shm region and no doorbell of the process is left in /dev/shm', () => {
      for (const side of ['send', 'recv']) {
        expect(pair.out).toMatch(new RegExp(`^ok - v12 transfer \\[${side}\\]: after finalize no libfabric shm region of this process is left`, 'm'));
        expect(pair.out).toMatch(new RegExp(`^ok - v12 transfer \\[${side}\\]: after finalize no doorbell of this process is left in /dev/shm \\(0\\)$`, 'm'));
      }
    });

    it('init logs the version of libfabric, the provider, its NICs and whether GPU memory is registered', async () => {
      const r = await run(['tables', '--version', '12', '--verbose'], provider);
      expect(r.err).toMatch(/NET\/tsnet ofi: libfabric 1\.\d+ \(API 1\.\d+\), provider (tcp;ofi_rxm|shm), FI_PROGRESS_(AUTO|MANUAL)/);
      expect(r.err).toMatch(/NET\/tsnet ofi: NIC \S+: .*inject \d+ B/);
      expect(r.err).toMatch(/NET\/tsnet ofi: (host memory only: .+|GPU memory is registered directly)/);
      expect(r.err).toMatch(/NET\/tsnet transport ofi, \d+ device\(s\)/);
    });

    // With TSNET_DIRECT_SEND_MAX set, small sends and writes with immediate data go as injects
    // from the protocol thread itself (Port.submitOfiNow); TSNET_STATS counts them per thread.
    // By default (off over libfabric) none go that way, and the same checks pass.
    it('--procs 2: TSNET_DIRECT_SEND_MAX=8192 has the protocol thread inject small sends and writes itself; none by default', async () => {
      const sent = (r: Run) => [...r.err.matchAll(/NET\/tsnet stats: protocol thread \d+: .*; sent by this thread itself (\d+) \(in part (\d+)\)$/gm)];
      for (const [max, on] of [['8192', true], [undefined, false]] as const) {
        const r = await run(['transfer,grouped', '--procs', '2', '--version', '12', '--verbose'], provider, {
          TSNET_STATS: '1',
          ...(max ? { TSNET_DIRECT_SEND_MAX: max } : {}),
        });
        expect(r.out.split('\n').filter((l) => l.startsWith('not ok')), r.err.slice(-3000)).toEqual([]);
        expect(r.status).toBe(0);
        expect(r.out).toMatch(new RegExp(`^ok - v12 transfer \\[recv\\]: recv of ${64 << 20} bytes: data equal`, 'm'));
        const m = sent(r);
        expect(m.length, r.err.slice(-3000)).toBeGreaterThanOrEqual(2); // each process, at its finalize
        const here = m.map((x) => Number(x[1]));
        for (const x of m) expect(Number(x[2]), 'an inject goes whole or not at all').toBe(0);
        if (on) expect(Math.min(...here), `sent here per process: ${here.join(', ')}`).toBeGreaterThan(0);
        else expect(here.every((n) => n === 0)).toBe(true);
        // TSNET_STATS also times connecting over libfabric: the connector's wait for the ACCEPT,
        // the listener's CONNECT to ready
        const q = '(< \\d+|>= \\d+) us';
        const part = (a: string, b: string) => `${a} median ${q}, p99 ${q}, max \\d+ us; ${b} median ${q}, p99 ${q}, max \\d+ us`;
        expect(r.err).toMatch(new RegExp(`NET/tsnet stats: protocol thread \\d+: connects: [1-9]\\d* comm\\(s\\) up, first call to comm median ${q}, p99 ${q}, max \\d+ us; ${part('first call to ready', 'ready to connected')}; \\d+ call\\(s\\)`, 'm'));
        expect(r.err).toMatch(new RegExp(`NET/tsnet stats: protocol thread \\d+: accepts: [1-9]\\d* comm\\(s\\) up; ${part('first message to ready', 'ready to accepted')}; \\d+ call\\(s\\)`, 'm'));
      }
    }, 240_000);

    // The closing end tells its peer (CLOSE), in another process or in this one: the sends
    // waiting there fail within the grace, well before TSNET_TIMEOUT_SEC (3 s here) would have told.
    for (const which of ['--procs 2', '--procs 1'])
      it(`${which}: peerclose: the receiver's close is told to the sender, not waited out`, () => {
        const r = which === '--procs 2' ? pair : one;
        expect(r.out).toMatch(/^ok - v12 peerclose \[send\]: the 3 sends pending at the receiver's close ended, 3 with an error$/m);
        expect(r.out).toMatch(/^ok - v12 peerclose \[send\]: the sends ended \d+\.\d+ s after the close, before 0\.6 of TSNET_TIMEOUT_SEC \(3 s\): the transport told the sender$/m);
        // (in one process the log line carries whichever prefix was set last: a role's, or the
        // pair's once the roles are done)
        expect(r.err).toMatch(/v12 peerclose( \[(send|recv)\])?: log 2: NET\/tsnet ofi \S+ send comm \d+: the peer closed its comm \d+\.\d s ago with requests pending here; failing 3 pending request\(s\)/);
        expect(r.err).not.toMatch(/peerclose .*nothing heard from the peer/);
      });

    // A closed listener's endpoint refuses a CONNECT, and a closed receiver is told, in one process.
    it('--procs 1: lifecycle: a connect to a closed listener is refused and a closed receiver told, neither waited out', () => {
      expect(one.err).toMatch(/lifecycle: log 2: NET\/tsnet connect: ofi \S+ send comm \d+: connect: refused: the listener is closed/);
      expect(one.err).toMatch(/lifecycle: log 2: NET\/tsnet ofi \S+ send comm \d+: the peer closed its comm \d+\.\d s ago with requests pending here; failing 3 pending request\(s\)/);
      expect(one.err).not.toMatch(/lifecycle: .*(nothing heard from the peer|no answer from the listener)/);
    });

    it('--procs 1: exits 0 with no failed check', () => {
      expect(one.out.split('\n').filter((l) => l.startsWith('not ok')), why(one.err)).toEqual([]);
      expect(one.status).toBe(0);
    });

    for (const scenario of ONE) it(`--procs 1: ${scenario}`, () => expectScenario(one.out, scenario));
  });

// A NIC repeated: every rail its own endpoint on its own I/O thread (shm copies on the
// receiving endpoint's thread, so this is how a comm copies on several), messages striped and
// round-robin over endpoints that share one NIC and one domain.
describe.skipIf(!HAVE_LIBFABRIC)('C driver, libfabric shm, OFI_NCCL_FORCE_NUM_RAILS=3', () => {
  const scenarios = ['transfer', 'inflight', 'grouped', 'pushback'];
  let pair: Run;
  beforeAll(async () => {
    requireLib();
    // No silence to see here: the default link timeout. With 3 s, a connect that got no answer
    // within 3 s failed once, in a clean-clone run of every suite on 2 cores.
    pair = await run([scenarios.join(','), '--procs', '2', '--version', '12', '--verbose'], 'shm', { OFI_NCCL_FORCE_NUM_RAILS: '3', TSNET_TIMEOUT_SEC: '10' });
    console.log(`driver over ofi shm, 3 rails: --procs 2 ${pair.seconds.toFixed(1)} s`);
  }, 600_000);

  it('exits 0 with no failed check, 64 MiB validated', () => {
    expect(pair.out.split('\n').filter((l) => l.startsWith('not ok')), why(pair.err)).toEqual([]);
    expect(pair.status).toBe(0);
    expect(pair.out).toMatch(new RegExp(`^ok - v12 transfer \\[recv\\]: recv of ${64 << 20} bytes: data equal`, 'm'));
  });

  for (const scenario of scenarios) it(scenario, () => expectScenario(pair.out, scenario));

  it('opens three endpoints of the one NIC on three I/O threads, and comms use 3 rails', () => {
    const opened = pair.err.match(/NET\/tsnet ofi shm: 3 rail\(s\) on 1 NIC\(s\), endpoints on I\/O thread\(s\) (\d+), (\d+), (\d+)/);
    expect(opened, pair.err.slice(-4000)).not.toBeNull();
    expect(new Set(opened!.slice(1)).size).toBe(3);
    expect(pair.err).toMatch(/ofi shm send comm \d+: connected to comm \d+, 3 rail\(s\)/);
  });
});

// The same with TSNET_OFI_SMALL_RAIL=comm: each comm's small messages, single-stripe writes up
// to the eager limit and control messages on its home rail, longer ones over the three.
describe.skipIf(!HAVE_LIBFABRIC)('C driver, libfabric shm, 3 rails, TSNET_OFI_SMALL_RAIL=comm', () => {
  const scenarios = ['transfer', 'inflight', 'grouped', 'pushback'];
  let pair: Run;
  beforeAll(async () => {
    requireLib();
    pair = await run([scenarios.join(','), '--procs', '2', '--version', '12', '--verbose'], 'shm', {
      OFI_NCCL_FORCE_NUM_RAILS: '3',
      TSNET_OFI_SMALL_RAIL: 'comm',
      TSNET_TIMEOUT_SEC: '10', // as above
    });
    console.log(`driver over ofi shm, 3 rails, one home rail per comm: --procs 2 ${pair.seconds.toFixed(1)} s`);
  }, 600_000);

  it('exits 0 with no failed check, 64 MiB validated, and says which schedule it took', () => {
    expect(pair.out.split('\n').filter((l) => l.startsWith('not ok')), why(pair.err)).toEqual([]);
    expect(pair.status).toBe(0);
    expect(pair.out).toMatch(new RegExp(`^ok - v12 transfer \\[recv\\]: recv of ${64 << 20} bytes: data equal`, 'm'));
    expect(pair.err).toMatch(/ofi small messages' rails = one per comm \(TSNET_OFI_SMALL_RAIL\)/);
  });

  for (const scenario of scenarios) it(scenario, () => expectScenario(pair.out, scenario));
});

// shm refuses to start when /dev/shm is short of space (a container's default is 64 MiB): init
// fails with a WARN that gives the space, not only "no provider". A 4 MiB tmpfs over /dev/shm in
// a private mount namespace (`unshare -m`): needs root, skipped otherwise.
describe.skipIf(!HAVE_LIBFABRIC || process.getuid?.() !== 0)('libfabric shm with /dev/shm short of space', () => {
  it('init fails with rc 2 and a WARN naming the free space of /dev/shm; the process lives on', async () => {
    requireLib();
    const script = 'mount -t tmpfs -o size=4M tmpfs /dev/shm || exit 77; exec "$DRIVER" tables --procs 1 --version 12 --lib "$LIB"';
    const r = await runAsync('unshare', ['-m', 'bash', '-c', script], {
      cwd: ROOT,
      env: { ...process.env, DRIVER: buildDriver(), LIB, TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm', TSNET_TIMEOUT_SEC: '3' },
      timeout: 120_000,
    });
    // 77, or unshare refused: this container cannot make a mount namespace.
    if (r.status === 77 || /unshare failed/.test(r.stderr)) return console.log(`skipped: ${r.stderr.trim()}`);
    const all = r.stdout + r.stderr;
    expect(all).not.toMatch(/died of signal/);
    expect(r.stdout).toMatch(/^not ok - v12 tables: init \(rc 2\)$/m);
    expect(all).toMatch(/TSNET_TRANSPORT=ofi: no libfabric provider offers .*; \/dev\/shm has 4 MiB free of 4 MiB, and shm refuses to start when its regions would not fit/);
  }, 120_000);
});

/**
 * Runs script (bash) as root in a private mount namespace over a fresh tmpfs /dev/shm, with the
 * driver, the library and libfabric shm in its environment; null where this container cannot make
 * mount or pid namespaces (77, or unshare refused), after saying so.
 */
async function withPrivateShm(lines: string[]): Promise<Ran | null> {
  const script = ['mount -t tmpfs -o size=256M tmpfs /dev/shm || exit 77', ...lines].join('\n');
  const r = await runAsync('unshare', ['-m', 'bash', '-c', script], {
    cwd: ROOT,
    env: { ...process.env, DRIVER: buildDriver(), LIB, TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm', TSNET_TIMEOUT_SEC: '3' },
    timeout: 180_000,
  });
  if (r.status === 77 || /unshare failed/.test(r.stderr)) {
    console.log(`skipped: ${r.stderr.trim()}`);
    return null;
  }
  return r;
}

// A killed process leaves its shm region in /dev/shm, named for its pid ("<pid>:<uid>:<index>")
// and giving that pid as its owner. A later process with the same pid is refused that name
// (EBUSY, "shm file in use"); the endpoint then takes the next name and says so. Two runs of
// the driver's pair in fresh pid namespaces (the same pids each time) over a private /dev/shm:
// the first killed once both processes have their regions (stopped first, all of them: one
// SIGKILL at a time let the driver's parent reap a killed role and remove its region before its
// own came, and 0 regions were left in one run). Root only, skipped otherwise.
describe.skipIf(!HAVE_LIBFABRIC || process.getuid?.() !== 0)('libfabric shm after a killed process with the same pid', () => {
  it('the pair passes, each endpoint past the refused name, with an INFO line that says so', async () => {
    requireLib();
    const r = await withPrivateShm([
      // Only builtins while the driver starts: each fork would take a pid.
      `unshare -p -f --mount-proc bash -c 'shopt -s nullglob; "$DRIVER" transfer --procs 2 --version 12 --lib "$LIB" > /dev/null 2>&1 & ` +
        'while f=(/dev/shm/*:0:0); (( ${#f[@]} < 2 && SECONDS < 60 )); do :; done; ' +
        't=${EPOCHREALTIME/./}; while (( ${EPOCHREALTIME/./} - t < 300000 )); do :; done; kill -STOP -1 2>/dev/null; kill -9 -1 2>/dev/null; true\' || exit 77',
      'echo "left: $(cd /dev/shm && echo *)"',
      `exec unshare -p -f --mount-proc bash -c '"$DRIVER" transfer --procs 2 --version 12 --verbose --lib "$LIB" & wait $!'`,
    ]);
    if (!r) return;
    const left = r.stdout.match(/^left: (.*)$/m)?.[1] ?? '';
    expect(left.split(' ').filter((f) => /^\d+:0:0$/.test(f)).length, r.stdout.slice(-2000)).toBe(2);
    expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), why(r.stderr)).toEqual([]);
    expect(r.status).toBe(0);
    const skipped = (r.stdout + r.stderr).match(/ofi: shm refused 1 region name\(s\) for this pid \(\d+\)/g) ?? [];
    expect(skipped.length).toBe(2);
  }, 180_000);
});

// An empty file named for a process's pid in /dev/shm (a process killed between shm's
// shm_open and its ftruncate leaves one): shm reads its header without looking at its size and
// ends the next process with that pid with SIGBUS inside fi_enable. tsnet refuses to enable the
// endpoint instead (native/ofi/ofi_endpoint.cc, docs/ofi-facts.md): the call fails with
// ncclSystemError and a WARN that names the file, and the process lives. The driver's pair in a
// fresh pid namespace over a private /dev/shm with an empty "<pid>:0:0" for every pid it can
// get. Root only, skipped otherwise.
describe.skipIf(!HAVE_LIBFABRIC || process.getuid?.() !== 0)('libfabric shm with an empty region file of the same pid', () => {
  it('listen or connect fails with rc 2 and a WARN naming the file, no signal', async () => {
    requireLib();
    const r = await withPrivateShm([
      'for p in $(seq 1 64); do : > /dev/shm/$p:0:0; done',
      `exec unshare -p -f --mount-proc bash -c '"$DRIVER" transfer --procs 2 --version 12 --lib "$LIB" & wait $!'`,
    ]);
    if (!r) return;
    const all = r.stdout + r.stderr;
    expect(all, why(r.stderr)).not.toMatch(/died of signal|timed out/);
    expect(r.stdout).toMatch(/^not ok - v12 transfer \[(recv|send)\]: (listen on dev 0 \(rc 2\)|connect returned 2)$/m);
    expect(r.stderr).toMatch(/log 2: NET\/tsnet (listen|connect): .*not enabled: \/dev\/shm\/\d+:0:0 is an empty file named for this process \(pid \d+\).*SIGBUS; remove the file/);
    expect(r.status).toBe(1);
  }, 180_000);
});
