// Sockets watched from the protocol thread's event loop without Node's sockets (uv_poll in
// native/engine/engine_js.cc): the TCP handshake's steps run when their socket is ready, as
// they did through Node's events, at a fraction of the cost of a Node socket per connection.
import { log } from '../../log';

/** The engine's calls for watching a socket (native/engine/engine_js.cc). */
export interface WatchBinding {
  /** The one function of this thread that every watch calls with its id. */
  fdWatchHandler(fn: (id: number) => void): void;
  /** Watches fd for readable (and writable) until fdUnwatch; its id. */
  fdWatch(fd: number, writable: boolean): number;
  fdWatchWritable(id: number, writable: boolean): void;
  /** Stops the watch; call before the fd is closed. */
  fdUnwatch(id: number): void;
}

/** The watches of one thread: the binding's handler dispatches by id. */
export class FdWatches {
  private static readonly byBinding = new WeakMap<WatchBinding, FdWatches>();
  private readonly fns = new Map<number, () => void>();

  private constructor(private readonly binding: WatchBinding) {
    binding.fdWatchHandler((id) => {
      const fn = this.fns.get(id);
      if (!fn) return;
      try {
        fn();
      } catch (e) {
        log.warn(`a socket's handshake step failed: ${(e as Error).stack ?? e}`);
      }
    });
  }

  /** This thread's watches (a binding is one thread's). */
  static of(binding: WatchBinding): FdWatches {
    let w = FdWatches.byBinding.get(binding);
    if (!w) FdWatches.byBinding.set(binding, (w = new FdWatches(binding)));
    return w;
  }

  /** fn runs while fd is readable, or writable too where asked, until unwatch. */
  watch(fd: number, writable: boolean, fn: () => void): number {
    const id = this.binding.fdWatch(fd, writable);
    this.fns.set(id, fn);
    return id;
  }

  writable(id: number, on: boolean): void {
    this.binding.fdWatchWritable(id, on);
  }

  unwatch(id: number): void {
    if (!this.fns.delete(id)) return;
    this.binding.fdUnwatch(id);
  }

  /** Watches open (tests). */
  get size(): number {
    return this.fns.size;
  }
}
