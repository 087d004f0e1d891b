// One socket of a TCP connect, without Node's sockets: a non-blocking connect, the greeting
// written and the listener's answer read, each one system call, made when the socket is ready
// (a watch on the protocol thread's event loop), once at the connect's first call, and at the
// watchdog's tick. Through Node's sockets (a net.Socket per connection, a pass of the event
// loop per step) a handshake took 2-8 ms under NCCL; this way about half that
// (docs/performance.md, items 42 and 43).
import { constants } from 'node:os';
import { getSystemErrorName } from 'node:util';
import type { FdWatches, WatchBinding } from './watch';
import { HELLO_BYTES } from './wire';

/** The engine's calls a TCP handshake makes (native/engine/engine_js.cc). */
export interface DialBinding extends WatchBinding {
  /** A listening socket on every address, on a port the kernel picks, or what failed. */
  tcpListen(): { fd: number; port: number } | { errno: number; syscall: string };
  /** The next waiting connection and its peer ("address:port"), or -errno (-EAGAIN: none). */
  tcpAccept(fd: number): { fd: number; from: string } | number;
  /** A socket whose connect has begun: its fd, or what failed. */
  tcpDial(address: string, port: number, local?: string): number | { errno: number; syscall: string };
  /** 1 connected, 0 in progress, -errno failed. */
  tcpDialed(fd: number): number;
  /** Bytes sent, or -errno. */
  fdSend(fd: number, bytes: Uint8Array): number;
  /** Bytes read (0: the peer closed), or -errno. */
  fdRecv(fd: number, into: Uint8Array): number;
}

export const EAGAIN = -constants.errno.EAGAIN;

/** A failed system call worded as Node words its own ("connect ECONNREFUSED 10.0.0.1:4000"), with errno's name as code. */
export function dialError(errno: number, syscall: string, to?: string): NodeJS.ErrnoException {
  let code: string;
  try {
    code = getSystemErrorName(errno);
  } catch {
    code = `errno ${-errno}`;
  }
  const e: NodeJS.ErrnoException = new Error(`${syscall} ${code}${to ? ` ${to}` : ''}`);
  e.code = code;
  e.errno = errno;
  e.syscall = syscall;
  return e;
}

/** What a step of a dial came to. */
export type DialState =
  | { kind: 'waiting' }
  | { kind: 'answered'; answer: Buffer }
  /** The listener closed the socket before its whole answer came (error: it reset it). */
  | { kind: 'closed'; error?: NodeJS.ErrnoException }
  | { kind: 'failed'; error: NodeJS.ErrnoException };

export class Dial {
  /** The socket, -1 once closed or handed over. */
  fd = -1;
  private connected = false;
  private sent = 0;
  private readonly answer = Buffer.alloc(HELLO_BYTES);
  private have = 0;
  private state: DialState = { kind: 'waiting' };
  private watch = 0;

  /** onReady: the socket is ready for the next step (its watch fired). */
  constructor(
    private readonly binding: DialBinding,
    private readonly watches: FdWatches,
    private readonly close: (fd: number) => void,
    readonly address: string,
    readonly port: number,
    local: string | undefined,
    private readonly greeting: Uint8Array,
    onReady: () => void,
  ) {
    const r = binding.tcpDial(address, port, local);
    if (typeof r !== 'number') {
      this.state = { kind: 'failed', error: dialError(r.errno, r.syscall, `${address}:${port}`) };
      return;
    }
    this.fd = r;
    try {
      this.watch = watches.watch(r, true, onReady);
    } catch (e) {
      this.dispose();
      throw e;
    }
  }

  /**
   * Moves the handshake on as far as it goes without blocking. The answer is read in place and
   * not a byte further: the listener may write its first frames as soon as it has its comm, and
   * those stay in the kernel for the engine.
   */
  step(): DialState {
    if (this.state.kind !== 'waiting') return this.state;
    if (!this.connected) {
      const c = this.binding.tcpDialed(this.fd);
      if (c === 0) return this.state;
      if (c < 0) return this.end(this.closedOr(c, 'connect', `${this.address}:${this.port}`));
      this.connected = true;
      this.watches.writable(this.watch, false); // a connected socket is always writable: only the answer is awaited
    }
    while (this.sent < this.greeting.length) {
      const w = this.binding.fdSend(this.fd, this.greeting.subarray(this.sent));
      if (w === EAGAIN) return this.state;
      if (w < 0) return this.end(this.closedOr(w, 'write'));
      this.sent += w;
    }
    while (this.have < HELLO_BYTES) {
      const n = this.binding.fdRecv(this.fd, this.answer.subarray(this.have));
      if (n === EAGAIN) return this.state;
      if (n === 0) return this.end({ kind: 'closed' });
      if (n < 0) return this.end(this.closedOr(n, 'read'));
      this.have += n;
    }
    this.state = { kind: 'answered', answer: this.answer };
    this.unwatch();
    return this.state;
  }

  /** Connected, and the greeting written whole (the answer may still be on its way). */
  get greeted(): boolean {
    return this.connected && this.sent === this.greeting.length && this.state.kind !== 'failed' && this.state.kind !== 'closed';
  }

  /** The fd for the engine to take (it dups it; close() then closes this one). */
  take(): number {
    if (this.fd < 0) throw new Error('the socket was closed');
    return this.fd;
  }

  /** Closes the socket (a dial given up, or handed over: the engine holds its own dup). */
  dispose(): void {
    this.unwatch();
    if (this.fd >= 0) this.close(this.fd);
    this.fd = -1;
  }

  private unwatch(): void {
    if (this.watch) this.watches.unwatch(this.watch);
    this.watch = 0;
  }

  private closedOr(errno: number, syscall: string, to?: string): DialState {
    const error = dialError(errno, syscall, to);
    return error.code === 'ECONNRESET' || error.code === 'EPIPE' ? { kind: 'closed', error } : { kind: 'failed', error };
  }

  private end(s: DialState): DialState {
    this.state = s;
    this.dispose();
    return s;
  }
}
