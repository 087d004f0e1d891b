// readConfig(env, cores): defaults, each variable's parsing, precedence, aliases, errors that
// name the variable (and quote its value), and the lines it returns for logging.
import { describe, expect, it } from 'vitest';
import { ResultCode } from '../../plugin/abi';
import { readConfig } from '../../plugin/config';
import { NetError } from '../../plugin/errors';
import { threshold } from '../../plugin/protocol/policies/eager';
import { byTag, roundRobin } from '../../plugin/protocol/policies/lanes';
import { even, fixed } from '../../plugin/protocol/policies/stripes';

const KiB = 1024;
const MiB = 1024 * KiB;

/** The NetError readConfig(env) throws. */
function failure(env: Record<string, string>): NetError {
  try {
    readConfig(env);
  } catch (e) {
    expect(e).toBeInstanceOf(NetError);
    return e as NetError;
  }
  throw new Error(`readConfig(${JSON.stringify(env)}) did not throw`);
}

describe('readConfig defaults', () => {
  it('gives the documented defaults for an empty environment', () => {
    const { config } = readConfig({}, 2);
    expect(config).toEqual({
      transport: 'tcp',
      loopbackDevices: 1,
      nsocks: 4,
      eagerMax: 64 * KiB,
      minStripe: 128 * KiB,
      socketIfname: undefined,
      socketFamily: undefined,
      deviceGroups: undefined,
      cores: 2,
      ioThreads: 8,
      protocolThreads: 1,
      eagerPolicy: threshold,
      stripePolicy: even,
      lanePolicy: roundRobin,
      traceFile: undefined,
      stats: false,
      statsSteps: false,
      spinUs: 0,
      spinMaxUs: 0,
      pollUs: 50,
      directSendMax: 8192,
      directIdleUs: 0,
      earlyWake: false,
      connectEarly: false,
      timeoutSec: 10,
      ofi: undefined,
      latencyUs: 0,
      warmup: 10000,
    });
  });

  it('logs every default, marked (default)', () => {
    expect(readConfig({}, 2).lines).toEqual([
      'transport = tcp (default)',
      'data sockets per comm = 4 (default)',
      'eager max bytes = 65536 (default)',
      'min stripe bytes = 131072 (default)',
      'I/O threads = 8 (default)',
      'protocol threads = 1 (default)',
      'busy-poll window us = 0 (default)',
      'frames written by the protocol thread up to bytes = 8192 (default)',
      'link timeout seconds = 10 (default)',
      'warm-up messages at init = 10000 (default)',
    ]);
  });

  it('warms up with TSNET_WARMUP messages per protocol thread, 0 to 100000 (0: none)', () => {
    expect(readConfig({ TSNET_WARMUP: '0' }, 2).config.warmup).toBe(0);
    expect(readConfig({ TSNET_WARMUP: '100000' }, 2).config.warmup).toBe(100000);
    expect(readConfig({ TSNET_WARMUP: '250' }, 2).lines).toContain('warm-up messages at init = 250 (TSNET_WARMUP)');
    expect(() => readConfig({ TSNET_WARMUP: '100001' }, 2)).toThrow(/TSNET_WARMUP=100001: expected 0 to 100000/);
    expect(() => readConfig({ TSNET_WARMUP: '-1' }, 2)).toThrow(/TSNET_WARMUP=-1: expected/);
    expect(() => readConfig({ TSNET_WARMUP: 'yes' }, 2)).toThrow(/TSNET_WARMUP=yes: expected an integer/);
  });

  it('polls 200 us after activity by default only with 8 cores or more', () => {
    expect(readConfig({}, 8).config.spinUs).toBe(200);
    expect(readConfig({}, 7).config.spinUs).toBe(0);
    expect(readConfig({ TSNET_SPIN_US: '7' }, 2).config.spinUs).toBe(7);
  });

  it('TSNET_SPIN_MAX_US: 5000 by default where the window is on (8 cores or more), else off; more than the window, or 0; a window of 0 cannot grow', () => {
    const dflt = readConfig({}, 8);
    expect(dflt.config).toMatchObject({ spinUs: 200, spinMaxUs: 5000 });
    expect(dflt.lines).toContain('busy-poll window grows with late wake-ups up to us = 5000 (default)');
    expect(readConfig({}, 2).config).toMatchObject({ spinUs: 0, spinMaxUs: 0 });
    expect(readConfig({}, 2).lines.filter((l) => l.includes('grows'))).toEqual([]);
    // A window set at or above the default's ceiling does not grow unless asked to.
    expect(readConfig({ TSNET_SPIN_US: '5000' }, 8).config.spinMaxUs).toBe(0);
    expect(readConfig({ TSNET_SPIN_US: '1000' }, 8).config.spinMaxUs).toBe(5000);
    expect(readConfig({ TSNET_SPIN_US: '0' }, 8).config.spinMaxUs).toBe(0);
    const set = readConfig({ TSNET_SPIN_MAX_US: '5000' }, 8);
    expect(set.config).toMatchObject({ spinUs: 200, spinMaxUs: 5000 });
    expect(set.lines).toContain('busy-poll window grows with late wake-ups up to us = 5000 (TSNET_SPIN_MAX_US)');
    expect(readConfig({ TSNET_SPIN_MAX_US: '0' }, 8).lines).toContain('busy-poll window grows with late wake-ups up to us = off (TSNET_SPIN_MAX_US)');
    expect(() => readConfig({ TSNET_SPIN_MAX_US: '200' }, 8)).toThrow(/TSNET_SPIN_MAX_US=200: expected 0, or more than the busy-poll window \(200 us/);
    expect(() => readConfig({ TSNET_SPIN_MAX_US: '5000' }, 2)).toThrow(/a window of 0 never spins, so it cannot grow/);
    expect(() => readConfig({ TSNET_SPIN_MAX_US: 'lots' }, 8)).toThrow(/TSNET_SPIN_MAX_US=lots: expected an integer/);
  });

  it('lets the protocol thread write frames up to TSNET_DIRECT_SEND_MAX payload bytes itself (-1: never)', () => {
    expect(readConfig({ TSNET_DIRECT_SEND_MAX: '-1' }, 2).config.directSendMax).toBe(-1);
    expect(readConfig({ TSNET_DIRECT_SEND_MAX: '-1' }, 2).lines).toContain('frames written by the protocol thread up to bytes = off (TSNET_DIRECT_SEND_MAX)');
    expect(readConfig({ TSNET_DIRECT_SEND_MAX: '0' }, 2).config.directSendMax).toBe(0);
    expect(readConfig({ TSNET_DIRECT_SEND_MAX: '65536' }, 2).lines).toContain('frames written by the protocol thread up to bytes = 65536 (TSNET_DIRECT_SEND_MAX)');
    // libfabric writes no frames to a socket: its line says what the limit means there
    const ofi = readConfig({ TSNET_TRANSPORT: 'ofi' }, 2).lines;
    expect(ofi.some((l) => l.startsWith('frames written'))).toBe(false);
    expect(ofi).toContain('sends and writes the protocol thread injects itself up to bytes = off (default)');
    expect(readConfig({ TSNET_TRANSPORT: 'ofi' }, 2).config.directSendMax).toBe(-1);
    expect(readConfig({ TSNET_TRANSPORT: 'ofi', TSNET_DIRECT_SEND_MAX: '8192' }, 2).lines).toContain('sends and writes the protocol thread injects itself up to bytes = 8192 (TSNET_DIRECT_SEND_MAX)');
    const ofiOff = readConfig({ TSNET_TRANSPORT: 'ofi', TSNET_DIRECT_SEND_MAX: '-1' }, 2);
    expect(ofiOff.config.directSendMax).toBe(-1);
    expect(ofiOff.lines).toContain('sends and writes the protocol thread injects itself up to bytes = off (TSNET_DIRECT_SEND_MAX)');
    expect(ofiOff.lines.some((l) => l.startsWith('frames written'))).toBe(false);
    expect(() => readConfig({ TSNET_DIRECT_SEND_MAX: '-2' }, 2)).toThrow(/TSNET_DIRECT_SEND_MAX=-2: expected -1 to 1048576/);
    // ... only on a lane that wrote nothing for TSNET_DIRECT_SEND_IDLE_US (default and 0: any lane); said only when set
    expect(readConfig({}, 2).config.directIdleUs).toBe(0);
    expect(readConfig({}, 2).lines.some((l) => l.includes('lane idle'))).toBe(false);
    expect(readConfig({ TSNET_DIRECT_SEND_IDLE_US: '5' }, 2).lines).toContain('written by the protocol thread only on a lane idle for us = 5 (TSNET_DIRECT_SEND_IDLE_US)');
    expect(readConfig({ TSNET_DIRECT_SEND_IDLE_US: '0' }, 2).lines).toContain('written by the protocol thread only on a lane idle for us = any (TSNET_DIRECT_SEND_IDLE_US)');
    expect(readConfig({ TSNET_DIRECT_SEND_IDLE_US: '1000' }, 2).config.directIdleUs).toBe(1000);
    expect(() => readConfig({ TSNET_DIRECT_SEND_IDLE_US: '1001' }, 2)).toThrow(/TSNET_DIRECT_SEND_IDLE_US=1001: expected 0 to 1000/);
    expect(() => readConfig({ TSNET_DIRECT_SEND_IDLE_US: 'soon' }, 2)).toThrow(/TSNET_DIRECT_SEND_IDLE_US=soon: expected an integer/);
    expect(() => readConfig({ TSNET_DIRECT_SEND_MAX: 'small' }, 2)).toThrow(/TSNET_DIRECT_SEND_MAX=small: expected an integer/);
  });

  it('gives TCP comms before the ACKs only with TSNET_CONNECT_EARLY=1; says so only when set', () => {
    const d = readConfig({}, 2);
    expect(d.config.connectEarly).toBe(false);
    expect(d.lines.join('\n')).not.toMatch(/TSNET_CONNECT_EARLY/);
    const on = readConfig({ TSNET_CONNECT_EARLY: '1' }, 2);
    expect(on.config.connectEarly).toBe(true);
    expect(on.lines).toContain('TCP connects give their comm before the ACKs = on (TSNET_CONNECT_EARLY)');
    expect(readConfig({ TSNET_CONNECT_EARLY: '0' }, 2).lines).toContain('TCP connects give their comm before the ACKs = off (TSNET_CONNECT_EARLY)');
    expect(() => readConfig({ TSNET_CONNECT_EARLY: 'maybe' }, 2)).toThrow(/TSNET_CONNECT_EARLY=maybe: expected 0 or 1/);
  });

  it('wakes protocol threads with their I/O threads only with TSNET_EARLY_WAKE=1; says so only when set', () => {
    expect(readConfig({}, 2).config.earlyWake).toBe(false);
    expect(readConfig({}, 2).lines.some((l) => l.includes('woken with'))).toBe(false);
    const off = readConfig({ TSNET_EARLY_WAKE: '0' }, 2);
    expect(off.config.earlyWake).toBe(false);
    expect(off.lines).toContain('protocol threads woken with their I/O threads = off (TSNET_EARLY_WAKE)');
    expect(readConfig({ TSNET_EARLY_WAKE: 'yes', TSNET_SPIN_US: '200' }, 2).lines).toContain('protocol threads woken with their I/O threads = on (TSNET_EARLY_WAKE)');
    expect(readConfig({ TSNET_EARLY_WAKE: '1', TSNET_SPIN_US: '0' }, 2).lines).toContain(
      'protocol threads woken with their I/O threads = on, but no busy-poll window to open (TSNET_EARLY_WAKE)',
    );
    expect(() => readConfig({ TSNET_EARLY_WAKE: 'maybe' }, 2)).toThrow(/TSNET_EARLY_WAKE=maybe: expected 0 or 1/);
  });

  it('polls endpoints without a wait fd every 50 us after activity unless TSNET_OFI_POLL_US says otherwise', () => {
    expect(readConfig({}, 2).config.pollUs).toBe(50);
    const set = readConfig({ TSNET_OFI_POLL_US: '5', TSNET_TRANSPORT: 'ofi' }, 2);
    expect(set.config.pollUs).toBe(5);
    expect(set.lines).toContain('poll interval us of endpoints without a wait fd = 5 (TSNET_OFI_POLL_US)');
    expect(readConfig({ TSNET_TRANSPORT: 'ofi' }, 2).lines).toContain('poll interval us of endpoints without a wait fd = 50 (default)');
    expect(() => readConfig({ TSNET_OFI_POLL_US: '0' }, 2)).toThrow(/TSNET_OFI_POLL_US=0: expected 1 to 1000/);
    expect(() => readConfig({ TSNET_OFI_POLL_US: 'fast' }, 2)).toThrow(/TSNET_OFI_POLL_US=fast: expected an integer/);
  });

  it('treats an empty value as unset', () => {
    const { config } = readConfig({
      TSNET_TRANSPORT: '',
      TSNET_NSOCKS: '',
      TSNET_EAGER_MAX: '',
      TSNET_MIN_STRIPE: '',
      TSNET_TIMEOUT_SEC: '',
      NCCL_SOCKET_FAMILY: '',
      NCCL_SOCKET_IFNAME: '',
      TSNET_PROTOCOL_THREADS: '',
      TSNET_EAGER_POLICY: '',
      TSNET_STRIPE_POLICY: '',
      TSNET_LANE_POLICY: '',
      TSNET_TRACE: '',
      TSNET_STATS: '',
      TSNET_IO_THREADS: '',
    }, 2);
    expect(config).toEqual(readConfig({}, 2).config);
  });

  it('ignores variables it does not know, TSNET_IO (removed) among them', () => {
    expect(readConfig({ TSNET_NOPE: 'x', NCCL_DEBUG: 'INFO' }, 2)).toEqual(readConfig({}, 2));
    expect(readConfig({ TSNET_IO: 'node' }, 2)).toEqual(readConfig({}, 2));
  });
});

describe('readConfig parses each variable', () => {
  it('TSNET_TRANSPORT, case-insensitive', () => {
    expect(readConfig({ TSNET_TRANSPORT: 'loopback' }).config.transport).toBe('loopback');
    expect(readConfig({ TSNET_TRANSPORT: 'LoopBack' }).config.transport).toBe('loopback');
    expect(readConfig({ TSNET_TRANSPORT: 'TCP' }).config.transport).toBe('tcp');
    expect(readConfig({ TSNET_TRANSPORT: 'LOOPBACK' }).lines[0]).toBe('transport = loopback (TSNET_TRANSPORT)');
  });

  it('TSNET_LOOPBACK_DEVICES, 1 to 64, logged only for the loopback transport', () => {
    expect(readConfig({ TSNET_LOOPBACK_DEVICES: '1' }).config.loopbackDevices).toBe(1);
    expect(readConfig({ TSNET_LOOPBACK_DEVICES: '64' }).config.loopbackDevices).toBe(64);
    const loop = readConfig({ TSNET_TRANSPORT: 'loopback', TSNET_LOOPBACK_DEVICES: '3' });
    expect(loop.config.loopbackDevices).toBe(3);
    expect(loop.lines).toContain('loopback devices = 3 (TSNET_LOOPBACK_DEVICES)');
    expect(readConfig({ TSNET_TRANSPORT: 'loopback' }).lines).toContain('loopback devices = 1 (default)');
    expect(readConfig({ TSNET_LOOPBACK_DEVICES: '3' }).lines.join('\n')).not.toMatch(/loopback devices/);
  });

  it.each([
    ['1', 1],
    ['4', 4],
    ['64', 64],
    [' 8 ', 8],
    ['007', 7],
  ])('TSNET_NSOCKS=%j gives %i data sockets', (value, n) => {
    const { config, lines } = readConfig({ TSNET_NSOCKS: value });
    expect(config.nsocks).toBe(n);
    expect(lines).toContain(`data sockets per comm = ${n} (TSNET_NSOCKS)`);
  });

  it.each([
    [{ NCCL_SOCKET_NTHREADS: '4', NCCL_NSOCKS_PERTHREAD: '4' }, 16, 'NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_SOCKET_NTHREADS: '2', NCCL_NSOCKS_PERTHREAD: '3' }, 6, 'NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_SOCKET_NTHREADS: '16', NCCL_NSOCKS_PERTHREAD: '4' }, 64, 'NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_SOCKET_NTHREADS: '8', NCCL_NSOCKS_PERTHREAD: '8' }, 64, 'NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_SOCKET_NTHREADS: '3' }, 3, 'NCCL_SOCKET_NTHREADS'],
    [{ NCCL_NSOCKS_PERTHREAD: '5' }, 5, 'NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_SOCKET_NTHREADS: '1', NCCL_NSOCKS_PERTHREAD: '1' }, 1, 'NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD'],
  ])('NCCL socket variables %j give %i data sockets', (env, n, source) => {
    const { config, lines } = readConfig(env);
    expect(config.nsocks).toBe(n);
    expect(lines).toContain(`data sockets per comm = ${n} (${source})`);
  });

  it('TSNET_NSOCKS takes precedence over NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD', () => {
    const { config, lines } = readConfig({ TSNET_NSOCKS: '2', NCCL_SOCKET_NTHREADS: '4', NCCL_NSOCKS_PERTHREAD: '4' });
    expect(config.nsocks).toBe(2);
    expect(lines).toContain('data sockets per comm = 2 (TSNET_NSOCKS)');
    // Zero is a value, not "unset": it is rejected rather than falling back to the NCCL variables.
    expect(failure({ TSNET_NSOCKS: '0', NCCL_SOCKET_NTHREADS: '4' }).message).toBe('TSNET_NSOCKS=0: expected 1 to 64');
  });

  it.each([
    ['0', 0],
    ['1', 1],
    ['4096', 4096],
    [String(MiB), MiB],
  ])('TSNET_EAGER_MAX=%s', (value, n) => {
    const { config, lines } = readConfig({ TSNET_EAGER_MAX: value });
    expect(config.eagerMax).toBe(n);
    expect(lines).toContain(`eager max bytes = ${n} (TSNET_EAGER_MAX)`);
  });

  it('OFI_NCCL_EAGER_MAX_SIZE is an alias of TSNET_EAGER_MAX', () => {
    const { config, lines } = readConfig({ OFI_NCCL_EAGER_MAX_SIZE: '8192' });
    expect(config.eagerMax).toBe(8192);
    expect(lines).toContain('eager max bytes = 8192 (OFI_NCCL_EAGER_MAX_SIZE)');
  });

  it('TSNET_EAGER_MAX takes precedence over OFI_NCCL_EAGER_MAX_SIZE', () => {
    const { config, lines } = readConfig({ TSNET_EAGER_MAX: '100', OFI_NCCL_EAGER_MAX_SIZE: '8192' });
    expect(config.eagerMax).toBe(100);
    expect(lines).toContain('eager max bytes = 100 (TSNET_EAGER_MAX)');
    // An empty TSNET_EAGER_MAX does not hide the alias.
    expect(readConfig({ TSNET_EAGER_MAX: '', OFI_NCCL_EAGER_MAX_SIZE: '8192' }).config.eagerMax).toBe(8192);
  });

  it.each([
    [String(4 * KiB), 4 * KiB],
    [String(MiB), MiB],
    [String(64 * MiB), 64 * MiB],
  ])('TSNET_MIN_STRIPE=%s', (value, n) => {
    const { config, lines } = readConfig({ TSNET_MIN_STRIPE: value });
    expect(config.minStripe).toBe(n);
    expect(lines).toContain(`min stripe bytes = ${n} (TSNET_MIN_STRIPE)`);
  });

  it('NCCL_SOCKET_IFNAME is kept verbatim and logged', () => {
    for (const v of ['eth0', '^docker,lo', '=eth1', 'ib']) {
      const { config, lines } = readConfig({ NCCL_SOCKET_IFNAME: v });
      expect(config.socketIfname).toBe(v);
      expect(lines).toContain(`interfaces = ${v} (NCCL_SOCKET_IFNAME)`);
    }
    expect(readConfig({}).lines.join('\n')).not.toMatch(/interfaces/);
  });

  it.each([
    ['AF_INET', 4],
    ['af_inet', 4],
    ['4', 4],
    ['AF_INET6', 6],
    ['af_inet6', 6],
    ['6', 6],
  ] as const)('NCCL_SOCKET_FAMILY=%s gives family %i', (value, family) => {
    const { config, lines } = readConfig({ NCCL_SOCKET_FAMILY: value });
    expect(config.socketFamily).toBe(family);
    expect(lines.some((l) => l.startsWith('address family = ') && l.endsWith('(NCCL_SOCKET_FAMILY)'))).toBe(true);
  });

  it.each([
    ['1', 1],
    ['30', 30],
    ['3600', 3600],
  ])('TSNET_TIMEOUT_SEC=%s', (value, n) => {
    const { config, lines } = readConfig({ TSNET_TIMEOUT_SEC: value });
    expect(config.timeoutSec).toBe(n);
    expect(lines).toContain(`link timeout seconds = ${n} (TSNET_TIMEOUT_SEC)`);
  });

  it('logs one line per setting, naming where each value came from', () => {
    const { lines } = readConfig({
      TSNET_TRANSPORT: 'loopback',
      TSNET_LOOPBACK_DEVICES: '2',
      NCCL_SOCKET_NTHREADS: '2',
      NCCL_NSOCKS_PERTHREAD: '2',
      OFI_NCCL_EAGER_MAX_SIZE: '1024',
      TSNET_MIN_STRIPE: '65536',
      NCCL_SOCKET_IFNAME: 'lo',
      NCCL_SOCKET_FAMILY: 'AF_INET',
      TSNET_TIMEOUT_SEC: '5',
      TSNET_DEVICE_GROUPS: 'a+b',
      TSNET_IO_THREADS: '3',
      TSNET_STRIPE_POLICY: 'fixed',
      TSNET_LANE_POLICY: 'tag',
      TSNET_EAGER_POLICY: 'threshold',
      TSNET_TRACE: '/tmp/trace.json',
      TSNET_STATS: '1',
      TSNET_SPIN_US: '50',
    }, 2);
    expect(lines).toEqual([
      'transport = loopback (TSNET_TRANSPORT)',
      'loopback devices = 2 (TSNET_LOOPBACK_DEVICES)',
      'data sockets per comm = 4 (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD)',
      'eager max bytes = 1024 (OFI_NCCL_EAGER_MAX_SIZE)',
      'min stripe bytes = 65536 (TSNET_MIN_STRIPE)',
      'interfaces = lo (NCCL_SOCKET_IFNAME)',
      'address family = AF_INET (NCCL_SOCKET_FAMILY)',
      'device groups = a+b (TSNET_DEVICE_GROUPS)',
      'protocol threads = 1 (default)',
      'eager policy = threshold (TSNET_EAGER_POLICY)',
      'stripe policy = fixed (TSNET_STRIPE_POLICY)',
      'lane policy = tag (TSNET_LANE_POLICY)',
      'trace file = /tmp/trace.json (TSNET_TRACE)',
      'statistics = on (TSNET_STATS)',
      'busy-poll window us = 50 (TSNET_SPIN_US)',
      'busy-poll window grows with late wake-ups up to us = 5000 (default)',
      'link timeout seconds = 5 (TSNET_TIMEOUT_SEC)',
      'warm-up messages at init = 10000 (default)',
    ]);
  });
});

describe('readConfig: threads, policies, trace and statistics', () => {
  it.each([
    [1, 1],
    [2, 1],
    [15, 1],
    [16, 2],
    [31, 2],
    [32, 4],
    [128, 4],
  ])('with %i cores, %i protocol thread(s) by default', (cores, n) => {
    const { config, lines } = readConfig({}, cores);
    expect(config.protocolThreads).toBe(n);
    expect(lines).toContain(`protocol threads = ${n} (default)`);
  });

  it.each([
    ['OMPI_COMM_WORLD_LOCAL_SIZE', '4', 16, 4, { protocolThreads: 1, spinUs: 0, ioThreads: 4 }],
    ['LOCAL_WORLD_SIZE', '2', 64, 32, { protocolThreads: 4, spinUs: 200, ioThreads: 8 }],
    ['MPI_LOCALNRANKS', '8', 64, 8, { protocolThreads: 1, spinUs: 200, ioThreads: 8 }],
    ['SLURM_NTASKS_PER_NODE', '4(x2)', 32, 8, { protocolThreads: 1, spinUs: 200, ioThreads: 8 }],
    ['OMPI_COMM_WORLD_LOCAL_SIZE', '16', 16, 1, { protocolThreads: 1, spinUs: 0, ioThreads: 2 }],
  ] as const)('%s=%s on %i cores: the defaults count %i cores per rank', (name, value, total, share, want) => {
    const { config, lines } = readConfig({ [name]: value }, total);
    expect({ protocolThreads: config.protocolThreads, spinUs: config.spinUs, ioThreads: config.ioThreads }).toEqual(want);
    expect(lines).toContain(`cores for this process = ${share} (${total} cores, ${Number.parseInt(value, 10)} ranks on this host: ${name})`);
  });

  it('a CPU set smaller than the host is the share; one rank, bad values or none leave the host whole', () => {
    const bound = readConfig({ OMPI_COMM_WORLD_LOCAL_SIZE: '4' }, { total: 64, available: 8 });
    expect(bound.lines).toContain('cores for this process = 8 (its CPU affinity, of 64)');
    expect([bound.config.protocolThreads, bound.config.spinUs, bound.config.ioThreads]).toEqual([1, 200, 8]);
    for (const env of [{}, { LOCAL_WORLD_SIZE: '1', OMPI_COMM_WORLD_LOCAL_SIZE: '4' }, { OMPI_COMM_WORLD_LOCAL_SIZE: 'many' }, { MPI_LOCALNRANKS: '0' }]) {
      const { config, lines } = readConfig(env, 32);
      expect([config.protocolThreads, config.spinUs, config.ioThreads]).toEqual([4, 200, 8]);
      expect(lines.join('\n')).not.toMatch(/cores for this process/);
    }
    const set = readConfig({ OMPI_COMM_WORLD_LOCAL_SIZE: '4', TSNET_PROTOCOL_THREADS: '3', TSNET_SPIN_US: '50', TSNET_IO_THREADS: '6' }, 16);
    expect([set.config.protocolThreads, set.config.spinUs, set.config.ioThreads]).toEqual([3, 50, 6]);
  });

  it('TSNET_PROTOCOL_THREADS, 1 to 16, whatever the cores', () => {
    for (const n of [1, 3, 16]) {
      const { config, lines } = readConfig({ TSNET_PROTOCOL_THREADS: String(n) }, 64);
      expect(config.protocolThreads).toBe(n);
      expect(lines).toContain(`protocol threads = ${n} (TSNET_PROTOCOL_THREADS)`);
    }
    expect(readConfig({ TSNET_PROTOCOL_THREADS: '8' }, 2).config.protocolThreads).toBe(8);
  });

  it('the loopback transport has one protocol thread (its links live in one thread), with a line saying so', () => {
    const set = readConfig({ TSNET_TRANSPORT: 'loopback', TSNET_PROTOCOL_THREADS: '4' }, 64);
    expect(set.config.protocolThreads).toBe(1);
    expect(set.lines).toContain('protocol threads = 1 (TSNET_PROTOCOL_THREADS=4 ignored: loopback links live in one thread)');
    for (const cores of [2, 16, 64]) {
      const dflt = readConfig({ TSNET_TRANSPORT: 'loopback' }, cores);
      expect(dflt.config.protocolThreads).toBe(1);
      expect(dflt.lines.filter((l) => l.startsWith('protocol threads = '))).toEqual(['protocol threads = 1 (default)']);
    }
    const one = readConfig({ TSNET_TRANSPORT: 'loopback', TSNET_PROTOCOL_THREADS: '1' }, 64);
    expect(one.lines).toContain('protocol threads = 1 (TSNET_PROTOCOL_THREADS)');
  });

  it('TSNET_IO_THREADS, 1 to 64, logged for the transports that start I/O threads (tcp, ofi)', () => {
    const { config, lines } = readConfig({ TSNET_IO_THREADS: '3' }, 2);
    expect(config.ioThreads).toBe(3);
    expect(lines).toContain('I/O threads = 3 (TSNET_IO_THREADS)');
    expect(readConfig({ TSNET_TRANSPORT: 'ofi' }).lines).toContain('I/O threads = 8 (default)');
    expect(readConfig({ TSNET_IO_THREADS: '64' }).config.ioThreads).toBe(64);
    expect(readConfig({ TSNET_TRANSPORT: 'loopback', TSNET_IO_THREADS: '3' }).lines.join('\n')).not.toMatch(/I\/O threads/);
  });

  it.each([
    ['TSNET_EAGER_POLICY', 'threshold', 'eagerPolicy', threshold, 'eager policy'],
    ['TSNET_STRIPE_POLICY', 'even', 'stripePolicy', even, 'stripe policy'],
    ['TSNET_STRIPE_POLICY', 'fixed', 'stripePolicy', fixed, 'stripe policy'],
    ['TSNET_LANE_POLICY', 'roundrobin', 'lanePolicy', roundRobin, 'lane policy'],
    ['TSNET_LANE_POLICY', 'tag', 'lanePolicy', byTag, 'lane policy'],
  ] as const)('%s=%s picks that policy and logs it', (name, value, key, policy, words) => {
    const { config, lines } = readConfig({ [name]: value }, 2);
    expect(config[key]).toBe(policy);
    expect(lines).toContain(`${words} = ${value} (${name})`);
  });

  it('policies at their defaults are not logged', () => {
    expect(readConfig({}, 2).lines.join('\n')).not.toMatch(/policy/);
  });

  it('TSNET_TRACE names the trace file, %p replaced by the pid', () => {
    const { config, lines } = readConfig({ TSNET_TRACE: '/tmp/tsnet-%p.json' }, 2);
    expect(config.traceFile).toBe(`/tmp/tsnet-${process.pid}.json`);
    expect(lines).toContain(`trace file = /tmp/tsnet-${process.pid}.json (TSNET_TRACE)`);
    expect(readConfig({ TSNET_TRACE: '/tmp/%p/%p.json' }).config.traceFile).toBe(`/tmp/${process.pid}/${process.pid}.json`);
    expect(readConfig({ TSNET_TRACE: 'trace.json' }).config.traceFile).toBe('trace.json');
    expect(readConfig({}).config.traceFile).toBeUndefined();
    expect(readConfig({}).lines.join('\n')).not.toMatch(/trace/);
  });

  it('TSNET_STATS is 0, 1 or steps (any case); steps is 1 plus the steps of requests', () => {
    expect(readConfig({ TSNET_STATS: '1' }).config.stats).toBe(true);
    expect(readConfig({ TSNET_STATS: '1' }).config.statsSteps).toBe(false);
    for (const v of ['steps', 'STEPS']) {
      const { config, lines } = readConfig({ TSNET_STATS: v });
      expect([config.stats, config.statsSteps]).toEqual([true, true]);
      expect(lines).toContain('statistics = on, with the steps of requests (TSNET_STATS)');
    }
    expect(readConfig({ TSNET_STATS: '0' }).config.statsSteps).toBe(false);
    expect(readConfig({ TSNET_STATS: '1' }).lines).toContain('statistics = on (TSNET_STATS)');
    expect(readConfig({ TSNET_STATS: '0' }).config.stats).toBe(false);
    expect(readConfig({ TSNET_STATS: '0' }).lines).toContain('statistics = off (TSNET_STATS)');
    expect(readConfig({}).lines.join('\n')).not.toMatch(/statistics/);
  });
});

describe('readConfig for the libfabric transport', () => {
  it('reads the OFI_NCCL_* variables, logs them, and leaves the stream eager limit alone', () => {
    const { config, lines } = readConfig({ TSNET_TRANSPORT: 'ofi', OFI_NCCL_EAGER_MAX_SIZE: '-1', OFI_NCCL_NET_LATENCY: '2.5' }, 2);
    expect(config.transport).toBe('ofi');
    expect(config.ofi?.eagerMax).toBe(-1);
    expect(config.latencyUs).toBe(2.5);
    expect(config.eagerMax).toBe(64 * KiB); // OFI_NCCL_EAGER_MAX_SIZE is the ofi transport's own there
    expect(lines).toContain('ofi eager max bytes (header included) = disabled (OFI_NCCL_EAGER_MAX_SIZE)');
    expect(lines).toContain('latency us = 2.5 (OFI_NCCL_NET_LATENCY)');
    expect(lines.join('\n')).not.toMatch(/^eager max bytes/m);
  });

  it('under tcp, OFI_NCCL_EAGER_MAX_SIZE=-1 (eager off) keeps only empty messages inline', () => {
    expect(readConfig({ OFI_NCCL_EAGER_MAX_SIZE: '-1' }, 2).config.eagerMax).toBe(0);
    expect(readConfig({ TSNET_EAGER_MAX: '-1' }, 2).config.eagerMax).toBe(0);
  });
});

describe('readConfig rejects bad values with a NetError naming the variable', () => {
  it.each([
    [{ TSNET_TRANSPORT: 'udp' }, 'TSNET_TRANSPORT'],
    [{ TSNET_TRANSPORT: 'verbs' }, 'TSNET_TRANSPORT'],
    [{ TSNET_LOOPBACK_DEVICES: '0' }, 'TSNET_LOOPBACK_DEVICES'],
    [{ TSNET_LOOPBACK_DEVICES: '65' }, 'TSNET_LOOPBACK_DEVICES'],
    [{ TSNET_LOOPBACK_DEVICES: 'two' }, 'TSNET_LOOPBACK_DEVICES'],
    [{ TSNET_NSOCKS: '0' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '-1' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '65' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '4x' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '1.5' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '0x4' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '1e1' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '   ' }, 'TSNET_NSOCKS'],
    [{ TSNET_NSOCKS: '99999999999999999999999' }, 'TSNET_NSOCKS'],
    [{ NCCL_SOCKET_NTHREADS: '0' }, 'NCCL_SOCKET_NTHREADS'],
    [{ NCCL_SOCKET_NTHREADS: '17' }, 'NCCL_SOCKET_NTHREADS'],
    [{ NCCL_SOCKET_NTHREADS: 'auto' }, 'NCCL_SOCKET_NTHREADS'],
    [{ NCCL_NSOCKS_PERTHREAD: '0' }, 'NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_NSOCKS_PERTHREAD: '65' }, 'NCCL_NSOCKS_PERTHREAD'],
    [{ NCCL_SOCKET_NTHREADS: '2', NCCL_NSOCKS_PERTHREAD: 'x' }, 'NCCL_NSOCKS_PERTHREAD'],
    [{ TSNET_EAGER_MAX: '-2' }, 'TSNET_EAGER_MAX'],
    [{ TSNET_TRANSPORT: 'ofi', OFI_NCCL_EAGER_MAX_SIZE: '-2' }, 'OFI_NCCL_EAGER_MAX_SIZE'],
    [{ TSNET_TRANSPORT: 'ofi', OFI_NCCL_NET_LATENCY: 'soon' }, 'OFI_NCCL_NET_LATENCY'],
    [{ TSNET_TRANSPORT: 'ofi', TSNET_FLUSH: 'sometimes' }, 'TSNET_FLUSH'],
    [{ TSNET_EAGER_MAX: String(MiB + 1) }, 'TSNET_EAGER_MAX'],
    [{ TSNET_EAGER_MAX: '16k' }, 'TSNET_EAGER_MAX'],
    [{ OFI_NCCL_EAGER_MAX_SIZE: 'big' }, 'OFI_NCCL_EAGER_MAX_SIZE'],
    [{ OFI_NCCL_EAGER_MAX_SIZE: String(2 * MiB) }, 'OFI_NCCL_EAGER_MAX_SIZE'],
    [{ TSNET_MIN_STRIPE: '4095' }, 'TSNET_MIN_STRIPE'],
    [{ TSNET_MIN_STRIPE: String(64 * MiB + 1) }, 'TSNET_MIN_STRIPE'],
    [{ TSNET_MIN_STRIPE: '128K' }, 'TSNET_MIN_STRIPE'],
    [{ NCCL_SOCKET_FAMILY: 'AF_UNIX' }, 'NCCL_SOCKET_FAMILY'],
    [{ NCCL_SOCKET_FAMILY: '5' }, 'NCCL_SOCKET_FAMILY'],
    [{ TSNET_TIMEOUT_SEC: '0' }, 'TSNET_TIMEOUT_SEC'],
    [{ TSNET_TIMEOUT_SEC: '3601' }, 'TSNET_TIMEOUT_SEC'],
    [{ TSNET_TIMEOUT_SEC: '1.5' }, 'TSNET_TIMEOUT_SEC'],
    [{ TSNET_IO_THREADS: '0' }, 'TSNET_IO_THREADS'],
    [{ TSNET_IO_THREADS: '65' }, 'TSNET_IO_THREADS'],
    [{ TSNET_PROTOCOL_THREADS: '0' }, 'TSNET_PROTOCOL_THREADS'],
    [{ TSNET_PROTOCOL_THREADS: '17' }, 'TSNET_PROTOCOL_THREADS'],
    [{ TSNET_PROTOCOL_THREADS: 'many' }, 'TSNET_PROTOCOL_THREADS'],
    [{ TSNET_SPIN_US: '-1' }, 'TSNET_SPIN_US'],
    [{ TSNET_SPIN_US: '1000001' }, 'TSNET_SPIN_US'],
    [{ TSNET_EAGER_POLICY: 'always' }, 'TSNET_EAGER_POLICY'],
    [{ TSNET_STRIPE_POLICY: 'odd' }, 'TSNET_STRIPE_POLICY'],
    [{ TSNET_STRIPE_POLICY: 'EVEN' }, 'TSNET_STRIPE_POLICY'],
    [{ TSNET_LANE_POLICY: 'random' }, 'TSNET_LANE_POLICY'],
    [{ TSNET_STATS: 'yes' }, 'TSNET_STATS'],
    [{ TSNET_STATS: '2' }, 'TSNET_STATS'],
    [{ TSNET_STATS: 'true' }, 'TSNET_STATS'],
    [{ TSNET_STATS: 'step' }, 'TSNET_STATS'],
    [{ TSNET_MIN_STRIPE: '5000' }, 'TSNET_MIN_STRIPE'],
  ])('%j', (env, name) => {
    const e = failure(env);
    expect(e.code).toBe(ResultCode.INVALID_ARGUMENT);
    expect(e.message).toContain(name);
    // It also quotes the offending value.
    expect(e.message).toContain(`=${Object.values(env).at(-1)}`);
  });

  it('rejects more than 64 data sockets from NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD', () => {
    const e = failure({ NCCL_SOCKET_NTHREADS: '16', NCCL_NSOCKS_PERTHREAD: '8' });
    expect(e.code).toBe(ResultCode.INVALID_ARGUMENT);
    expect(e.message).toContain('NCCL_SOCKET_NTHREADS');
    expect(e.message).toContain('NCCL_NSOCKS_PERTHREAD');
    expect(e.message).toContain('128');
  });

  it('says what it expected', () => {
    expect(failure({ TSNET_NSOCKS: '65' }).message).toBe('TSNET_NSOCKS=65: expected 1 to 64');
    expect(failure({ TSNET_NSOCKS: '0' }).message).toBe('TSNET_NSOCKS=0: expected 1 to 64');
    expect(failure({ TSNET_NSOCKS: 'x' }).message).toBe('TSNET_NSOCKS=x: expected an integer');
    expect(failure({ TSNET_TRANSPORT: 'udp' }).message).toBe('TSNET_TRANSPORT=udp: expected tcp, ofi or loopback');
    expect(failure({ TSNET_MIN_STRIPE: '5000' }).message).toBe('TSNET_MIN_STRIPE=5000: expected a multiple of 4096');
    expect(failure({ TSNET_PROTOCOL_THREADS: '17' }).message).toBe('TSNET_PROTOCOL_THREADS=17: expected 1 to 16');
    expect(failure({ TSNET_STATS: 'yes' }).message).toBe('TSNET_STATS=yes: expected 0, 1 or steps');
  });

  it('names every known policy when a policy name is unknown', () => {
    expect(failure({ TSNET_EAGER_POLICY: 'always' }).message).toBe('TSNET_EAGER_POLICY=always: expected threshold');
    expect(failure({ TSNET_STRIPE_POLICY: 'odd' }).message).toBe('TSNET_STRIPE_POLICY=odd: expected even or fixed');
    expect(failure({ TSNET_LANE_POLICY: 'random' }).message).toBe('TSNET_LANE_POLICY=random: expected roundrobin or tag');
  });
});
