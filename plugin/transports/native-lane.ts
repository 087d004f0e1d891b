// Lanes over the native I/O engine (native/io.cc, docs/io-threads.md): the socket's bytes move
// on native I/O threads, straight from and into the posted views; this side only posts
// operations and dispatches their completions, on the plugin thread.
import type * as net from 'net';
import { constants } from 'os';
import { internalError, invalidArgument, remoteError } from '../errors';
import { log } from '../log';
import type { Binding } from '../native';
import type { Done, Lane } from './lane';

/** The part of the binding the engine uses (a fake one in unit tests). */
export type IoBinding = Pick<Binding, 'ioStart' | 'ioAdopt' | 'ioWrite' | 'ioRead' | 'ioClose' | 'ioStatus'>;

/** Completion statuses of the binding (besides -errno). */
export const IO_OK = 0;
export const IO_EOF = -1000;

export const DEFAULT_IO_THREADS = 4;

const errnoNames = new Map<number, string>(Object.entries(constants.errno).map(([name, n]) => [n, name]));

/** The error a failed operation's callback gets. EOF and resets are the peer's failures. */
export function ioError(status: number, lane: number, cancelled: number): Error {
  if (status === IO_EOF) return remoteError(`lane ${lane}: the peer closed the connection`);
  const name = errnoNames.get(-status) ?? `errno ${-status}`;
  if (status === cancelled) {
    const e = new Error(`lane ${lane} was closed`) as NodeJS.ErrnoException;
    e.code = name;
    e.errno = status;
    return e;
  }
  if (name === 'ECONNRESET' || name === 'EPIPE') return remoteError(`lane ${lane}: the peer reset the connection (${name})`);
  const e = new Error(`lane ${lane}: ${name}`) as NodeJS.ErrnoException;
  e.code = name;
  e.errno = status;
  return e;
}

interface Pending {
  done: Done;
  /** Keeps the views (and their memory) alive until the I/O thread is done with them. */
  keep: Uint8Array | Uint8Array[];
  lane: NativeLane;
}

/**
 * The process's I/O engine: starts the native threads on first use, numbers operations and
 * dispatches completions to their callbacks. One per process (NativeIo.get()).
 */
export class NativeIo {
  private static shared: NativeIo | undefined;
  private completions: Float64Array | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextOp = 1;
  private cancelled = -125;

  /**
   * The shared engine. The first call fixes the thread count (default DEFAULT_IO_THREADS);
   * the threads start on the first adopt. Later calls return the same engine.
   */
  static get(opts: { threads?: number; binding?: IoBinding; spinUs?: number } = {}): NativeIo {
    if (!NativeIo.shared) {
      const binding = opts.binding ?? (process as unknown as { _linkedBinding(name: string): IoBinding })._linkedBinding('tsnet');
      NativeIo.shared = new NativeIo(binding, opts.threads ?? DEFAULT_IO_THREADS, opts.spinUs ?? 0);
    } else if (opts.threads !== undefined && opts.threads !== NativeIo.shared.threads) {
      log.info(`native I/O: already running with ${NativeIo.shared.threads} threads; ${opts.threads} ignored`);
    }
    return NativeIo.shared;
  }

  constructor(
    private readonly binding: IoBinding,
    readonly threads: number,
    /** µs an I/O thread keeps polling after work before it sleeps. */
    private readonly spinUs = 0,
  ) {
    if (!Number.isInteger(threads) || threads < 1 || threads > 64) throw invalidArgument(`native I/O: threads must be 1..64, not ${threads}`);
  }

  /** Operations posted and not yet completed. */
  get inFlight(): number {
    return this.pending.size;
  }

  private start(): void {
    if (this.completions) return;
    const s = this.binding.ioStart(this.threads, (count) => this.onDone(count), this.spinUs);
    this.completions = s.completions;
    this.cancelled = this.binding.ioStatus.CANCELLED;
  }

  /** Takes over fd (dup'd: the caller still closes its own); thread pins the lane, else round robin. */
  adopt(fd: number, thread?: number): NativeLane {
    this.start();
    return new NativeLane(this, this.binding.ioAdopt(fd, thread));
  }

  /** @internal */
  post(lane: NativeLane, kind: 'write' | 'read', views: Uint8Array[] | Uint8Array, done: Done): void {
    const id = this.nextOp++;
    if (kind === 'write') this.binding.ioWrite(lane.id, views as Uint8Array[], id);
    else this.binding.ioRead(lane.id, views as Uint8Array, id);
    this.pending.set(id, { done, keep: views, lane });
  }

  /** @internal */
  close(lane: NativeLane): void {
    this.binding.ioClose(lane.id);
  }

  /** @internal */
  cancelError(lane: NativeLane): Error {
    return ioError(this.cancelled, lane.id, this.cancelled);
  }

  private onDone(count: number): void {
    const c = this.completions!;
    for (let i = 0; i < count; i++) {
      const id = c[2 * i];
      const status = c[2 * i + 1];
      const p = this.pending.get(id);
      if (!p) {
        log.warn(`native I/O: completion of unknown operation ${id} (status ${status})`);
        continue;
      }
      this.pending.delete(id);
      // After close, a lane's callbacks only ever see an error, even for an op that finished.
      const err = p.lane.closed ? this.cancelError(p.lane) : status === IO_OK ? undefined : ioError(status, p.lane.id, this.cancelled);
      try {
        p.done(err);
      } catch (e) {
        log.warn(`native I/O: a completion callback threw: ${(e as Error)?.stack ?? e}`);
      }
    }
  }
}

/**
 * A lane whose bytes move on a native I/O thread. Writes and reads complete in the order
 * posted, each direction on its own. After close() every callback not yet called (and every
 * later operation's) is called once with an error (code ECANCELED), never with success.
 */
export class NativeLane implements Lane {
  closed = false;

  constructor(
    private readonly io: NativeIo,
    readonly id: number,
  ) {}

  write(views: Uint8Array[], done: Done): void {
    if (this.closed) return queueMicrotask(() => done(this.io.cancelError(this)));
    this.io.post(this, 'write', views, done);
  }

  read(view: Uint8Array, done: Done): void {
    if (this.closed) return queueMicrotask(() => done(this.io.cancelError(this)));
    this.io.post(this, 'read', view, done);
  }

  /** When this returns, no I/O thread touches any view posted on the lane again. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.io.close(this);
  }
}

/**
 * Moves a connected, paused Node socket onto the native engine: its fd is dup'd into a lane,
 * then the Node socket is destroyed (closing only Node's fd). The caller guarantees that no
 * byte waits in Node's buffers and none arrives before this call (pause it before it reads).
 */
export function adoptSocket(socket: net.Socket, io: NativeIo = NativeIo.get(), thread?: number): NativeLane {
  const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw internalError('adoptSocket: the socket has no file descriptor (not connected, or not a TCP socket)');
  if (socket.readableLength > 0) throw internalError(`adoptSocket: ${socket.readableLength} unread bytes wait in the Node socket`);
  if (socket.writableLength > 0) throw internalError(`adoptSocket: ${socket.writableLength} bytes are still queued for writing in the Node socket`);
  const lane = io.adopt(fd, thread);
  socket.destroy();
  return lane;
}
