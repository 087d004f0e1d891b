// The TCP transport's listen when the system refuses a listening socket (a stub binding
// answers tcpListen with an errno): the WARN names the cause and what to do, and the call fails
// with ncclSystemError. Each case is one the real system gives: a process out of descriptors,
// and a host whose connections use up its ephemeral port range (EADDRINUSE on a port-0 bind,
// seen with 4 ranks on one host and thousands of comms over loopback).
import { constants } from 'os';
import { describe, expect, it } from 'vitest';
import { readConfig } from '../../plugin/config';
import { ResultCode } from '../../plugin/abi';
import { NetError } from '../../plugin/errors';
import { TcpTransport, type TcpIo } from '../../plugin/transports/tcp';
import type { NetDevice } from '../../plugin/transports/tcp/devices';

const { errno } = constants;

const dev: NetDevice = {
  name: 'lo',
  nics: [{ name: 'lo', family: 4, address: '127.0.0.1', pciPath: null, speedMbps: 10000, guid: 1n } as NetDevice['nics'][number]],
  pciPath: null,
  speedMbps: 10000,
  guid: 1n,
};

function transport(errno: number): TcpTransport {
  const binding = {
    tcpListen: () => ({ errno, syscall: 'listen' }),
    fdWatchHandler: () => {},
    fdWatch: () => {
      throw new Error('no watch expected');
    },
  } as unknown as TcpIo['binding'];
  const { config } = readConfig({ TSNET_TRANSPORT: 'tcp' }, 8);
  return new TcpTransport(config, { binding, port: {} as TcpIo['port'] }, [dev]);
}

function listenError(errno: number): NetError {
  try {
    transport(errno).listen(0);
  } catch (e) {
    if (e instanceof NetError) return e;
    throw e;
  }
  throw new Error('listen did not fail');
}

describe('tcp listen refused by the system', () => {
  it('EADDRINUSE: the ephemeral port range is used up, and what to do', () => {
    const e = listenError(-errno.EADDRINUSE);
    expect(e.code).toBe(ResultCode.SYSTEM_ERROR);
    expect(e.message).toMatch(/^listen on lo: listen EADDRINUSE: no port is free for it, .*ip_local_port_range.*widen the range or use fewer sockets$/);
  });

  it('EMFILE: the process is out of file descriptors', () => {
    const e = listenError(-errno.EMFILE);
    expect(e.code).toBe(ResultCode.SYSTEM_ERROR);
    expect(e.message).toMatch(/^listen on lo: no listening socket could be made, the process is out of file descriptors/);
  });

  it('any other errno: its name', () => {
    const e = listenError(-errno.EACCES);
    expect(e.code).toBe(ResultCode.SYSTEM_ERROR);
    expect(e.message).toBe('listen on lo: listen EACCES');
  });
});
