// readConfig(env): defaults, each variable's parsing, precedence, aliases, errors that name
// the variable, and the lines it returns for logging.
import { describe, expect, it } from 'vitest';
import { ResultCode } from '../../plugin/abi';
import { readConfig } from '../../plugin/config';
import { NetError } from '../../plugin/errors';

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
      io: 'native',
      ioThreads: 8,
      spinUs: 0,
      timeoutSec: 10,
    });
  });

  it('logs every default, marked (default)', () => {
    expect(readConfig({}, 2).lines).toEqual([
      'transport = tcp (default)',
      'data sockets per comm = 4 (default)',
      'eager max bytes = 65536 (default)',
      'min stripe bytes = 131072 (default)',
      'socket I/O = native (default)',
      'I/O threads = 8 (default)',
      'busy-poll window us = 0 (default)',
      'link timeout seconds = 10 (default)',
    ]);
  });

  it('polls 200 us after activity by default only with 8 cores or more', () => {
    expect(readConfig({}, 8).config.spinUs).toBe(200);
    expect(readConfig({}, 7).config.spinUs).toBe(0);
    expect(readConfig({ TSNET_SPIN_US: '7' }, 2).config.spinUs).toBe(7);
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
    });
    expect(config).toEqual(readConfig({}).config);
  });

  it('ignores variables it does not know', () => {
    expect(readConfig({ TSNET_NOPE: 'x', NCCL_DEBUG: 'INFO' })).toEqual(readConfig({}));
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
    ['0', 0],
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
    // Zero is a value, not "unset": it still wins.
    expect(readConfig({ TSNET_NSOCKS: '0', NCCL_SOCKET_NTHREADS: '4' }).config.nsocks).toBe(0);
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
    }, 2);
    expect(lines).toEqual([
      'transport = loopback (TSNET_TRANSPORT)',
      'loopback devices = 2 (TSNET_LOOPBACK_DEVICES)',
      'data sockets per comm = 4 (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD)',
      'eager max bytes = 1024 (OFI_NCCL_EAGER_MAX_SIZE)',
      'min stripe bytes = 65536 (TSNET_MIN_STRIPE)',
      'interfaces = lo (NCCL_SOCKET_IFNAME)',
      'address family = AF_INET (NCCL_SOCKET_FAMILY)',
      'busy-poll window us = 0 (default)',
      'link timeout seconds = 5 (TSNET_TIMEOUT_SEC)',
    ]);
  });
});

describe('readConfig rejects bad values with a NetError naming the variable', () => {
  it.each([
    [{ TSNET_TRANSPORT: 'udp' }, 'TSNET_TRANSPORT'],
    [{ TSNET_TRANSPORT: 'ofi' }, 'TSNET_TRANSPORT'],
    [{ TSNET_LOOPBACK_DEVICES: '0' }, 'TSNET_LOOPBACK_DEVICES'],
    [{ TSNET_LOOPBACK_DEVICES: '65' }, 'TSNET_LOOPBACK_DEVICES'],
    [{ TSNET_LOOPBACK_DEVICES: 'two' }, 'TSNET_LOOPBACK_DEVICES'],
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
    [{ TSNET_EAGER_MAX: '-1' }, 'TSNET_EAGER_MAX'],
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

  it('says which range it expected', () => {
    expect(failure({ TSNET_NSOCKS: '65' }).message).toMatch(/0 to 64/);
    expect(failure({ TSNET_NSOCKS: 'x' }).message).toMatch(/integer/);
    expect(failure({ TSNET_TRANSPORT: 'udp' }).message).toMatch(/tcp or loopback/);
  });
});
