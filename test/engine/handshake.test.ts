// The system calls of the TCP handshake without Node's sockets (native/engine/engine_js.cc:
// tcpListen, tcpAccept, tcpDial, tcpDialed, fdSend, fdRecv, fdWatch), and a Dial
// (plugin/transports/tcp/dial.ts) against them, from plain Node on the real engine addon.
import * as fs from 'fs';
import * as net from 'net';
import { constants } from 'os';
import { afterEach, describe, expect, it } from 'vitest';
import { Dial, type DialBinding, type DialState, EAGAIN } from '../../plugin/transports/tcp/dial';
import { FdWatches } from '../../plugin/transports/tcp/watch';
import { HELLO_BYTES } from '../../plugin/transports/tcp/wire';
import { engine, missing } from './helpers';

const binding = () => engine() as unknown as DialBinding;
const ECONNREFUSED = -constants.errno.ECONNREFUSED;
const open: number[] = [];
const track = (fd: number) => (open.push(fd), fd);
/** Closes a tracked fd now (afterEach must not close its number again: it may be reused). */
function closeNow(fd: number): void {
  open.splice(open.indexOf(fd), 1);
  fs.closeSync(fd);
}

afterEach(() => {
  for (const fd of open.splice(0)) fs.closeSync(fd);
});

function listen(b: DialBinding): { fd: number; port: number } {
  const l = b.tcpListen();
  if ('errno' in l) throw new Error(`tcpListen: ${l.syscall} ${l.errno}`);
  track(l.fd);
  return l;
}

function dial(b: DialBinding, port: number, address = '127.0.0.1'): number {
  const fd = b.tcpDial(address, port);
  if (typeof fd !== 'number') throw new Error(`tcpDial: ${fd.syscall} ${fd.errno}`);
  return track(fd);
}

async function until<T>(f: () => T | undefined, ms = 2000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 1));
  }
}

const accepted = (b: DialBinding, lfd: number) =>
  until(() => {
    const a = b.tcpAccept(lfd);
    if (typeof a === 'number') return a === EAGAIN ? undefined : ({ fd: a, from: '' } as never);
    track(a.fd);
    return a;
  });

describe.skipIf(missing)('the TCP handshake without Node sockets', () => {
  it('listen, dial, accept, and bytes each way; nothing to read is EAGAIN, a closed peer 0', async () => {
    const b = binding();
    const l = listen(b);
    expect(l.port).toBeGreaterThan(0);
    expect(b.tcpAccept(l.fd)).toBe(EAGAIN);
    const c = dial(b, l.port);
    expect(await until(() => (b.tcpDialed(c) === 1 ? 1 : undefined))).toBe(1);
    const a = await accepted(b, l.fd);
    expect(a.from).toMatch(/127\.0\.0\.1:\d+$/);
    const buf = new Uint8Array(8);
    expect(b.fdRecv(a.fd, buf)).toBe(EAGAIN);
    expect(b.fdSend(c, Uint8Array.from([1, 2, 3]))).toBe(3);
    const n = await until(() => {
      const r = b.fdRecv(a.fd, buf);
      return r === EAGAIN ? undefined : r;
    });
    expect([n, ...buf.subarray(0, 3)]).toEqual([3, 1, 2, 3]);
    closeNow(c);
    expect(await until(() => (b.fdRecv(a.fd, buf) === 0 ? 0 : undefined))).toBe(0);
  });

  it('a dial to a port nobody listens on fails with ECONNREFUSED; bad arguments throw', async () => {
    const b = binding();
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
    const port = (srv.address() as net.AddressInfo).port;
    await new Promise<void>((r) => srv.close(() => r()));
    const c = dial(b, port);
    expect(
      await until(() => {
        const r = b.tcpDialed(c);
        return r === 0 ? undefined : r;
      }),
    ).toBe(ECONNREFUSED);
    // Its error is read: asked again, the socket is still not one to greet on.
    expect(b.tcpDialed(c)).toBeLessThan(0);
    expect(() => b.tcpDial('localhost', port)).toThrow(/not a numeric address/);
    expect(() => b.tcpDial('127.0.0.1', 70000)).toThrow(/port must be/);
    expect(() => b.fdRecv(-1, new Uint8Array(1))).toThrow(/file descriptor/);
  });

  it('a watch fires while its socket is readable, and writable only while asked; none after unwatch', async () => {
    const b = binding();
    const w = FdWatches.of(b);
    const l = listen(b);
    const c = dial(b, l.port);
    let writable = 0;
    const id = w.watch(c, true, () => writable++);
    await until(() => (writable > 0 ? true : undefined));
    w.writable(id, false);
    const a = await accepted(b, l.fd);
    let reads = 0;
    const rid = w.watch(a.fd, false, () => {
      reads++;
      b.fdRecv(a.fd, new Uint8Array(16)); // level-triggered: read, or it fires again
    });
    await new Promise((r) => setTimeout(r, 20));
    expect(reads).toBe(0);
    const before = writable;
    await new Promise((r) => setTimeout(r, 20));
    expect(writable).toBe(before); // connected, not watched for writable: quiet
    b.fdSend(c, Uint8Array.from([9]));
    await until(() => (reads > 0 ? true : undefined));
    w.unwatch(rid);
    w.unwatch(id);
    b.fdSend(c, Uint8Array.from([9]));
    const seen = reads;
    await new Promise((r) => setTimeout(r, 20));
    expect(reads).toBe(seen);
    expect(w.size).toBe(0);
  });

  it('a Dial greets and reads its 48-byte answer, not a byte further, moved on by its watch alone', async () => {
    const b = binding();
    const w = FdWatches.of(b);
    const l = listen(b);
    const greeting = Buffer.alloc(HELLO_BYTES, 7);
    let ready = 0;
    let last: DialState = { kind: 'waiting' };
    const closed: number[] = [];
    // As the connector does: each time the socket is ready, the handshake moves on. The test
    // never steps it itself.
    const d: Dial = new Dial(b, w, (fd) => (closed.push(fd), fs.closeSync(fd)), '127.0.0.1', l.port, undefined, greeting, () => {
      ready++;
      last = d.step();
    });
    const a = await accepted(b, l.fd);
    const got = new Uint8Array(HELLO_BYTES + 8);
    let have = 0;
    await until(() => {
      const n = b.fdRecv(a.fd, got.subarray(have));
      if (n > 0) have += n;
      return have === HELLO_BYTES ? true : undefined;
    });
    expect(Buffer.from(got.subarray(0, HELLO_BYTES)).equals(greeting)).toBe(true);
    expect(last.kind).toBe('waiting');
    const answer = Buffer.alloc(HELLO_BYTES, 3);
    expect(b.fdSend(a.fd, Buffer.concat([answer.subarray(0, 20)]))).toBe(20);
    await until(() => (ready >= 2 ? true : undefined)); // woken for part of the answer: still waiting
    expect(last.kind).toBe('waiting');
    expect(b.fdSend(a.fd, Buffer.concat([answer.subarray(20), Buffer.alloc(24, 5)]))).toBe(HELLO_BYTES - 20 + 24);
    const s = await until(() => (last.kind === 'waiting' ? undefined : last));
    expect(s.kind).toBe('answered');
    if (s.kind === 'answered') expect(s.answer.equals(answer)).toBe(true);
    const fd = d.take();
    const rest = new Uint8Array(64);
    expect(b.fdRecv(fd, rest)).toBe(24); // the bytes after the answer stayed in the kernel
    d.dispose();
    expect(closed).toEqual([fd]);
    expect(w.size).toBe(0);
  });

  it('a Dial whose listener closes before answering ends as closed, its socket closed', async () => {
    const b = binding();
    const w = FdWatches.of(b);
    const l = listen(b);
    const closed: number[] = [];
    const d = new Dial(b, w, (fd) => (closed.push(fd), fs.closeSync(fd)), '127.0.0.1', l.port, undefined, Buffer.alloc(HELLO_BYTES), () => {});
    const a = await accepted(b, l.fd);
    closeNow(a.fd);
    const s = await until(() => {
      const st = d.step();
      return st.kind === 'waiting' ? undefined : st;
    });
    expect(s.kind).toBe('closed');
    expect(closed.length).toBe(1);
    expect(d.fd).toBe(-1);
    expect(w.size).toBe(0);
  });
});
