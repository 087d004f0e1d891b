// TSNET_STATS=steps: where a request's time goes between the threads it crosses, as medians
// and p99s printed at finalize. It takes the timestamps TSNET_TRACE takes (NCCL's thread when
// it posted the request, the protocol thread when it picked it up, the I/O threads' completions)
// plus the moment the turn that picked it up handed its submissions to the I/O threads, and
// keeps them in memory: writing a trace file per request slowed an 8-byte exchange eightfold
// (docs/performance.md), which hides the very costs it should show.
import { OP_NAMES } from './native';
import type { RequestTrace } from './protocol/endpoint';

/** The latest samples of each interval kept for its quantiles. */
export const STEP_SAMPLES = 16384;

/**
 * Each kind's first requests are also counted apart: under NCCL the first thousand or so
 * operations of a small collective are slower than the rest (docs/performance.md), and the
 * steps tell whether the JavaScript or the hand-overs between threads are what is slower.
 */
export const START_REQUESTS = 2000;

/** The last `capacity` values of one interval, and the count and sum of all of them. */
export class Samples {
  private readonly ring: Float64Array;
  count = 0;
  sum = 0;

  constructor(private readonly capacity = STEP_SAMPLES) {
    this.ring = new Float64Array(capacity);
  }

  add(us: number): void {
    this.ring[this.count % this.capacity] = us;
    this.count++;
    this.sum += us;
  }

  /** The q-quantile (0..1) of the samples kept, nearest rank; NaN when there are none. */
  quantile(q: number): number {
    const n = Math.min(this.count, this.capacity);
    if (!n) return NaN;
    const sorted = this.ring.slice(0, n).sort();
    return sorted[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))];
  }
}

// Per comm and slot, in a Float64Array of FIELDS per slot.
const F_OP = 0; // 0: nothing in flight in the slot
const F_POSTED = 1;
const F_TAKEN = 2;
const F_SUBMITTED = 3; // 0 until the turn that picked it up flushed
const F_FIRST = 4; // the first I/O step's time, and its name's index
const F_FIRST_NAME = 5;
const F_LAST = 6;
const F_LAST_NAME = 7;
const F_ENTERED = 8; // the turn that picked it up: JavaScript entered, the requests handled, the completion rings read
const F_HANDLED = 9;
const F_POLLED = 10;
const F_WARMUP = 11; // 1: posted by the warm-up at init
const FIELDS = 12;

/** Kinds of the warm-up's requests are keyed by their op plus this, and printed after NCCL's. */
const WARMUP_KIND = 1000;

/** Intervals in the order a request crosses them. */
function rank(label: string): number {
  const turn = ['posted→picked up', 'picked up→in JS', 'in JS→handled', 'handled→polled', 'polled→submitted'].indexOf(label);
  if (turn >= 0) return turn / 10;
  if (label.startsWith('in JS→')) return 0.15; // a step made during the turn (a frame written here)
  if (label === 'posted→done') return 6;
  if (label === 'submitted→done') return 5;
  if (label.startsWith('submitted→')) return 2;
  if (label.endsWith('→done')) return 4;
  return 3;
}

const fmt = (us: number) => (us >= 100 ? us.toFixed(0) : us >= 10 ? us.toFixed(1) : us.toFixed(2));

export class StepStats {
  private readonly slots = new Map<number, Float64Array>();
  /** Requests picked up in this turn and not yet handed on: comm, slot pairs. */
  private turn: number[] = [];
  private readonly names: string[] = [];
  private readonly nameIds = new Map<string, number>();
  /**
   * Per kind of request (its Op, plus WARMUP_KIND for the warm-up's), its intervals, and those
   * of its first START_REQUESTS requests.
   */
  private readonly kinds = new Map<number, { requests: number; intervals: Map<string, Samples>; start: Map<string, Samples> }>();

  constructor(private readonly slotsPerComm: number) {}

  forComm(comm: number): RequestTrace {
    return { step: (slot, what, us) => this.step(comm, slot, what, us) };
  }

  /**
   * A request was picked up from the mailbox; times in µs of CLOCK_MONOTONIC (0: unknown).
   * `warmup`: the warm-up at init posted it; its kinds are counted and printed apart, so that
   * NCCL's lines (and their first requests) are NCCL's alone.
   */
  begin(comm: number, slot: number, op: number, postedUs: number, takenUs: number, warmup = false): void {
    let s = this.slots.get(comm);
    if (!s) this.slots.set(comm, (s = new Float64Array(this.slotsPerComm * FIELDS)));
    const b = slot * FIELDS;
    if (b < 0 || b >= s.length) return;
    s.fill(0, b, b + FIELDS);
    s[b + F_OP] = op;
    s[b + F_POSTED] = postedUs;
    s[b + F_TAKEN] = takenUs;
    s[b + F_WARMUP] = warmup ? 1 : 0;
    this.turn.push(comm, slot);
  }

  /**
   * The turn that picked the requests up ran JavaScript from `entered` and had handled them at
   * `handled`; called before it polls, where a request may end already (a frame the protocol
   * thread wrote itself completes in that poll).
   */
  started(entered: number, handled: number): void {
    const t = this.turn;
    for (let k = 0; k < t.length; k += 2) {
      const s = this.slots.get(t[k]);
      const b = t[k + 1] * FIELDS;
      if (!s || !s[b + F_OP]) continue;
      s[b + F_ENTERED] = entered;
      s[b + F_HANDLED] = handled;
    }
  }

  /**
   * The same turn (after started()) had read the completion rings at `polled` and handed its
   * submissions to the I/O threads at `submitted`.
   */
  flushed(polled: number, submitted: number): void {
    const t = this.turn;
    for (let k = 0; k < t.length; k += 2) {
      const s = this.slots.get(t[k]);
      const b = t[k + 1] * FIELDS;
      if (!s || !s[b + F_OP] || s[b + F_SUBMITTED]) continue;
      s[b + F_POLLED] = polled;
      s[b + F_SUBMITTED] = submitted;
    }
    t.length = 0;
  }

  step(comm: number, slot: number, what: string, us: number): void {
    const s = this.slots.get(comm);
    const b = slot * FIELDS;
    if (!s || !us || b < 0 || b >= s.length || !s[b + F_OP]) return;
    let id = this.nameIds.get(what);
    if (id === undefined) {
      id = this.names.push(what) - 1;
      this.nameIds.set(what, id);
    }
    if (!s[b + F_FIRST]) {
      s[b + F_FIRST] = us;
      s[b + F_FIRST_NAME] = id;
    }
    s[b + F_LAST] = us;
    s[b + F_LAST_NAME] = id;
  }

  /** The comm closed: its requests' times go (their intervals stay counted). */
  forget(comm: number): void {
    this.slots.delete(comm);
  }

  /** The request ended at `us`. */
  end(comm: number, slot: number, us: number): void {
    const s = this.slots.get(comm);
    const b = slot * FIELDS;
    if (!s || b < 0 || b >= s.length || !s[b + F_OP]) return;
    const kind = s[b + F_OP] + (s[b + F_WARMUP] ? WARMUP_KIND : 0);
    s[b + F_OP] = 0;
    let k = this.kinds.get(kind);
    if (!k) this.kinds.set(kind, (k = { requests: 0, intervals: new Map(), start: new Map() }));
    k.requests++;
    const early = k.requests <= START_REQUESTS;
    const add = (label: string, from: number, to: number) => {
      if (!from || !to || to < from) return;
      let x = k!.intervals.get(label);
      if (!x) k!.intervals.set(label, (x = new Samples()));
      x.add(to - from);
      if (!early) return;
      let y = k!.start.get(label);
      if (!y) k!.start.set(label, (y = new Samples(START_REQUESTS)));
      y.add(to - from);
    };
    const posted = s[b + F_POSTED];
    const taken = s[b + F_TAKEN];
    const submitted = s[b + F_SUBMITTED];
    add('posted→picked up', posted, taken);
    add('picked up→in JS', taken, s[b + F_ENTERED]);
    add('in JS→handled', s[b + F_ENTERED], s[b + F_HANDLED]);
    add('handled→polled', s[b + F_HANDLED], s[b + F_POLLED]);
    add('polled→submitted', s[b + F_POLLED], submitted);
    if (s[b + F_FIRST]) {
      const first = this.names[s[b + F_FIRST_NAME]];
      const last = this.names[s[b + F_LAST_NAME]];
      // A step before the turn handed anything on (a frame written on this thread): from the turn's start.
      if (submitted) add(`submitted→${first}`, submitted, s[b + F_FIRST]);
      else add(`in JS→${first}`, s[b + F_ENTERED], s[b + F_FIRST]);
      if (s[b + F_LAST] !== s[b + F_FIRST] || last !== first) add(`${first}→${last}`, s[b + F_FIRST], s[b + F_LAST]);
      add(`${last}→done`, s[b + F_LAST], us);
    } else add('submitted→done', submitted, us);
    add('posted→done', posted, us);
  }

  /**
   * One line per kind of request: each interval's median and p99 in µs (of the latest
   * STEP_SAMPLES), and how many it counted; for a kind of more than START_REQUESTS requests, a
   * second line with the same of its first START_REQUESTS. The warm-up's kinds come last.
   */
  lines(thread: number): string[] {
    const describe = (intervals: Map<string, Samples>, requests: number) =>
      [...intervals].sort((a, b) => rank(a[0]) - rank(b[0])).map(([label, x]) => `${label} ${fmt(x.quantile(0.5))} / ${fmt(x.quantile(0.99))}${x.count !== requests ? ` (${x.count})` : ''}`).join('; ');
    return [...this.kinds].sort((a, b) => a[0] - b[0]).flatMap(([kind, k]) => {
      const op = kind % WARMUP_KIND;
      const head = `stats: steps of ${OP_NAMES[op] ?? `op ${op}`}${kind >= WARMUP_KIND ? ' of the warm-up' : ''} on protocol thread ${thread}`;
      const all = `${head}, ${k.requests} requests, median / p99 us: ${describe(k.intervals, k.requests)}`;
      return k.requests > START_REQUESTS ? [all, `${head}, its first ${START_REQUESTS} requests, median / p99 us: ${describe(k.start, START_REQUESTS)}`] : [all];
    });
  }
}

/** Several observers of a comm's requests as one (TSNET_TRACE and TSNET_STATS=steps together). */
export function bothTraces(a: RequestTrace | undefined, b: RequestTrace | undefined): RequestTrace | undefined {
  if (!a || !b) return a ?? b;
  return { step: (slot, what, us, io) => (a.step(slot, what, us, io), b.step(slot, what, us, io)) };
}
