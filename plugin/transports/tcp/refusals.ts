// Logging the connections a listener refuses without flooding NCCL's log. Every refusal is
// logged at TRACE; the first few of a listener at WARN, each naming the peer and the
// reason; after that at most one WARN per interval, counting the refusals since the last
// WARN and naming the last one. A timer writes the count of a burst that ends within the
// interval, and close() writes what is still uncounted.
import { log } from '../../log';
import { monoMs } from '../../clock';

/** Runs fn after ms unless the returned function is called first. */
export type After = (ms: number, fn: () => void) => () => void;

const nodeAfter: After = (ms, fn) => {
  const t = setTimeout(fn, ms);
  t.unref(); // a pending count never keeps a process alive
  return () => clearTimeout(t);
};

export interface RefusalLogOptions {
  /** The clock, in ms. */
  now?: () => number;
  /** Refusals warned one by one before counting starts (default 5). */
  firstWarns?: number;
  /** The least time between two counting WARNs, in ms (default 10 s). */
  intervalMs?: number;
  /** The timer that writes a burst's count (tests pass their own). */
  after?: After;
}

export class RefusalLog {
  private readonly now: () => number;
  private readonly firstWarns: number;
  private readonly intervalMs: number;
  private readonly after: After;
  private refused = 0;
  /** Refusals since the last WARN, and the last of them. */
  private held = 0;
  private lastPeer = '';
  private lastWhy = '';
  private lastWarnAt = 0;
  private cancelTimer: (() => void) | undefined;

  /** what names the listener in every line ("listener on eth0"). */
  constructor(
    private readonly what: string,
    opts: RefusalLogOptions = {},
  ) {
    this.now = opts.now ?? monoMs;
    this.firstWarns = opts.firstWarns ?? 5;
    this.intervalMs = opts.intervalMs ?? 10_000;
    this.after = opts.after ?? nodeAfter;
  }

  /** peer ("address:port") was refused, for why. */
  refuse(peer: string, why: string): void {
    log.trace(() => `${this.what}: refused a connection from ${peer}: ${why}`);
    const now = this.now();
    if (++this.refused <= this.firstWarns) {
      const more = this.refused === this.firstWarns ? ` (${this.refused} refused: further refusals are counted, one WARN per ${this.intervalMs / 1000} s)` : '';
      log.warn(`${this.what}: refused a connection from ${peer}: ${why}${more}`);
      this.lastWarnAt = now;
      return;
    }
    this.held++;
    this.lastPeer = peer;
    this.lastWhy = why;
    if (now - this.lastWarnAt >= this.intervalMs) this.warnCount();
    else if (!this.cancelTimer) this.cancelTimer = this.after(this.lastWarnAt + this.intervalMs - now, () => this.warnCount());
  }

  /** The listener closes: the refusals not yet counted in a WARN are, now. */
  close(): void {
    this.warnCount();
  }

  private warnCount(): void {
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    if (this.held === 0) return;
    const now = this.now();
    const secs = ((now - this.lastWarnAt) / 1000).toFixed(1);
    const conns = this.held === 1 ? 'connection' : 'connections';
    log.warn(`${this.what}: refused ${this.held} more ${conns} in ${secs} s (${this.refused} in all), the last from ${this.lastPeer}: ${this.lastWhy}`);
    this.held = 0;
    this.lastWarnAt = now;
  }
}
