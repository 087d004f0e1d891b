// Matching messages to posted receives, the rule of aws-ofi-nccl, in one place for every
// transport and either side: over TCP the receiver matches arriving headers against its
// posted receives; over libfabric the sender matches its isends against the receives its
// control messages announce. A receive of n buffers (a single receive is a group of one)
// is a list of entries with a tag each. A message goes to the earliest posted receive that
// still has an unused entry with its tag, and there to the first such entry; a message with
// no such entry waits for a later post. Messages with equal tags keep their order (a tag
// already used in one group pushes the next message with it to the next group); messages
// with different tags may match out of arrival order. Matching is by tag only: the caller
// checks sizes (sizeError) and tracks the data.
//
// Cost: each tag has a queue of the open entries that carry it, in posting order, and a
// queue of the messages waiting for it, in arrival order; one of the two is always empty.
// arrive and the match of a waiting message are O(1) (one map lookup, one queue step);
// post is O(n) for its n ≤ 8 entries; a receive leaves in O(1) (a linked list). Queues are
// ring buffers that only grow and receive records come from a pool, so nothing is
// allocated per message or per post once warm (a new tag allocates its queues once).
// removeRecv and the describe/forEach helpers walk what is posted or waiting: close and
// diagnostics only.
import { objectArray } from '../arrays';

/** One buffer of a posted receive: its room and tag. */
export interface RecvEntry {
  size: number;
  tag: number;
}

/** Called once per match: entry index of recv takes msg. */
export type OnMatch<R, M> = (recv: R, index: number, msg: M) => void;

/** The most entries one receive may have (NCCL's maxRecvs). */
export const MAX_ENTRIES = 8;

/** The words for a message that does not fit the entry it matched, or undefined when it fits. */
export function sizeError(size: number, room: number, tag: number): string | undefined {
  return size > room ? `a ${size}-byte send does not fit the ${room}-byte receive (tag ${tag})` : undefined;
}

/** A FIFO over a power-of-two array that grows by doubling and never shrinks. */
class Ring<T> {
  private items: (T | undefined)[] = new Array(4).fill(undefined);
  private head = 0;
  count = 0;

  push(x: T): void {
    if (this.count === this.items.length) this.grow();
    this.items[(this.head + this.count) & (this.items.length - 1)] = x;
    this.count++;
  }

  /** The oldest item; only when count > 0. */
  peek(): T {
    return this.items[this.head] as T;
  }

  /** Takes the oldest item; only when count > 0. */
  shift(): T {
    const x = this.items[this.head] as T;
    this.items[this.head] = undefined;
    this.head = (this.head + 1) & (this.items.length - 1);
    this.count--;
    return x;
  }

  clear(): void {
    this.items.fill(undefined);
    this.head = this.count = 0;
  }

  private grow(): void {
    const old = this.items;
    this.items = new Array(old.length * 2).fill(undefined);
    for (let i = 0; i < this.count; i++) this.items[i] = old[(this.head + i) & (old.length - 1)];
    this.head = 0;
  }
}

/** Per tag: the open entries carrying it (posting order) or the messages waiting for it (arrival order). */
interface TagQueue<M> {
  /** Open entries as rec.id * MAX_ENTRIES + index. */
  open: Ring<number>;
  waiting: Ring<M>;
  /** Arrival numbers of the waiting messages. */
  waitingSeq: Ring<number>;
}

/** A posted receive; pooled, so its arrays are allocated once. */
interface Rec<R> {
  readonly id: number;
  recv: R | undefined;
  n: number;
  readonly tags: number[];
  /** Bit i set once entry i has a message. */
  used: number;
  /** Entries without a message. */
  left: number;
  /** Neighbours in posting order. */
  prev: Rec<R> | undefined;
  next: Rec<R> | undefined;
}

export class Matcher<R, M> {
  private readonly tagQueues = new Map<number, TagQueue<M>>();
  private readonly pool: Rec<R>[] = objectArray();
  private readonly free: number[] = [];
  private first: Rec<R> | undefined;
  private last: Rec<R> | undefined;
  private nPosted = 0;
  private nWaiting = 0;
  private arrivals = 0;
  // Matches not yet handed to onMatch (while onMatch runs, or a post's batch), as triples.
  private readonly outRecv = new Ring<R>();
  private readonly outIndex = new Ring<number>();
  private readonly outMsg = new Ring<M>();
  private delivering = false;
  // A post's matches of waiting messages, to be sorted by arrival.
  private readonly batchIndex: number[] = new Array(MAX_ENTRIES).fill(0);
  private readonly batchSeq: number[] = new Array(MAX_ENTRIES).fill(0);
  private readonly batchMsg: (M | undefined)[] = new Array(MAX_ENTRIES).fill(undefined);

  /**
   * onMatch is called once per match, never re-entered: a post or arrive made from inside
   * it is matched at once, and its onMatch calls follow when the current one returns.
   */
  constructor(private readonly onMatch: OnMatch<R, M>) {}

  /** Receives posted and not yet fully matched nor removed. */
  get posted(): number {
    return this.nPosted;
  }

  /** Messages waiting for a receive. */
  get waiting(): number {
    return this.nWaiting;
  }

  /**
   * A receive with entries.length (1..8) entries was posted; posting order is call order.
   * Waiting messages it can take are matched now and reported in their arrival order.
   * recv identifies the receive in onMatch and removeRecv: use a distinct object per post.
   */
  post(recv: R, entries: readonly RecvEntry[]): void {
    const n = entries.length;
    if (n < 1 || n > MAX_ENTRIES) throw new RangeError(`matching: a receive has 1 to ${MAX_ENTRIES} entries, not ${n}`);
    const rec = this.take(recv, n);
    let matched = 0;
    for (let i = 0; i < n; i++) {
      const tag = entries[i].tag;
      rec.tags[i] = tag;
      const q = this.queue(tag);
      if (q.waiting.count === 0) {
        q.open.push(rec.id * MAX_ENTRIES + i);
        continue;
      }
      // No earlier receive has this tag open (else the message would not wait): it is ours.
      const seq = q.waitingSeq.shift();
      const msg = q.waiting.shift();
      this.nWaiting--;
      rec.used |= 1 << i;
      rec.left--;
      // Insertion by arrival number: at most 8 entries.
      let k = matched++;
      for (; k > 0 && this.batchSeq[k - 1] > seq; k--) {
        this.batchSeq[k] = this.batchSeq[k - 1];
        this.batchIndex[k] = this.batchIndex[k - 1];
        this.batchMsg[k] = this.batchMsg[k - 1];
      }
      this.batchSeq[k] = seq;
      this.batchIndex[k] = i;
      this.batchMsg[k] = msg;
    }
    if (rec.left > 0) this.link(rec);
    else this.release(rec);
    for (let k = 0; k < matched; k++) {
      this.queueOut(recv, this.batchIndex[k], this.batchMsg[k] as M);
      this.batchMsg[k] = undefined;
    }
    this.deliver();
  }

  /**
   * A message with this tag arrived; arrival order is call order. It is matched now if a
   * posted receive has an unused entry with its tag (and onMatch called before arrive
   * returns, unless arrive was called from onMatch), else it waits for a later post.
   */
  arrive(msg: M, tag: number): void {
    const q = this.queue(tag);
    const seq = this.arrivals++;
    if (q.open.count === 0) {
      q.waiting.push(msg);
      q.waitingSeq.push(seq);
      this.nWaiting++;
      return;
    }
    const slot = q.open.shift();
    const rec = this.pool[(slot / MAX_ENTRIES) | 0];
    const index = slot % MAX_ENTRIES;
    const recv = rec.recv as R;
    rec.used |= 1 << index;
    if (--rec.left === 0) {
      this.unlink(rec);
      this.release(rec);
    }
    if (this.delivering || this.outIndex.count > 0) {
      this.queueOut(recv, index, msg);
      this.deliver();
      return;
    }
    this.delivering = true;
    try {
      this.onMatch(recv, index, msg);
    } finally {
      this.delivering = false;
    }
    this.deliver(); // what onMatch's own calls matched
  }

  /**
   * Takes recv out (deregMr or close with it in flight): its unused entries match nothing
   * from now on, and matches of it not yet handed to onMatch are dropped. True when it was
   * still posted or had such matches.
   */
  removeRecv(recv: R): boolean {
    let found = false;
    for (let k = this.outIndex.count; k > 0; k--) {
      const r = this.outRecv.shift();
      const i = this.outIndex.shift();
      const m = this.outMsg.shift();
      if (r === recv) found = true;
      else this.queueOut(r, i, m);
    }
    let rec = this.first;
    while (rec && rec.recv !== recv) rec = rec.next;
    if (!rec) return found;
    for (let i = 0; i < rec.n; i++) {
      if (rec.used & (1 << i)) continue;
      const open = this.queue(rec.tags[i]).open;
      const slot = rec.id * MAX_ENTRIES + i;
      for (let k = open.count; k > 0; k--) {
        const s = open.shift();
        if (s !== slot) open.push(s);
      }
    }
    this.unlink(rec);
    this.release(rec);
    return true;
  }

  /** Forgets every receive, waiting message and undelivered match (close, or a failed link). */
  clear(): void {
    for (const q of this.tagQueues.values()) {
      q.open.clear();
      q.waiting.clear();
      q.waitingSeq.clear();
    }
    while (this.first) {
      const rec = this.first;
      this.unlink(rec);
      this.release(rec);
    }
    this.nWaiting = 0;
    this.outRecv.clear();
    this.outIndex.clear();
    this.outMsg.clear();
  }

  /** Calls fn for each posted receive in posting order, from a list taken first (fn may remove them). */
  forEachRecv(fn: (recv: R) => void): void {
    const all: R[] = [];
    for (let rec = this.first; rec; rec = rec.next) all.push(rec.recv as R);
    all.forEach((r) => fn(r));
  }

  /** Calls fn for each waiting message in arrival order, from a list taken first. */
  forEachWaiting(fn: (msg: M, tag: number) => void): void {
    const all: { msg: M; tag: number; seq: number }[] = [];
    for (const [tag, q] of this.tagQueues)
      for (let k = q.waiting.count; k > 0; k--) {
        const seq = q.waitingSeq.shift();
        const msg = q.waiting.shift();
        all.push({ msg, tag, seq });
        q.waiting.push(msg);
        q.waitingSeq.push(seq);
      }
    all.sort((a, b) => a.seq - b.seq).forEach((w) => fn(w.msg, w.tag));
  }

  /** The message that has waited longest, with its tag; undefined when none waits. */
  oldestWaiting(): { msg: M; tag: number } | undefined {
    let best: { msg: M; tag: number } | undefined;
    let bestSeq = Infinity;
    for (const [tag, q] of this.tagQueues)
      if (q.waiting.count > 0 && q.waitingSeq.peek() < bestSeq) {
        bestSeq = q.waitingSeq.peek();
        best = { msg: q.waiting.peek(), tag };
      }
    return best;
  }

  /** What posted receives could still take, for messages that match nothing: "posted receives have unused tags 0, 1, 3 (2 receives)". */
  describeOpen(): string {
    if (!this.first) return 'no receive is posted';
    const tags = new Set<number>();
    for (let rec: Rec<R> | undefined = this.first; rec; rec = rec.next)
      for (let i = 0; i < rec.n; i++) if (!(rec.used & (1 << i))) tags.add(rec.tags[i]);
    const list = [...tags].sort((a, b) => a - b).join(', ');
    const recvs = `${this.nPosted} receive${this.nPosted === 1 ? '' : 's'}`;
    return `posted receives have unused tag${tags.size === 1 ? '' : 's'} ${list} (${recvs})`;
  }

  private queue(tag: number): TagQueue<M> {
    let q = this.tagQueues.get(tag);
    if (!q) {
      q = { open: new Ring<number>(), waiting: new Ring<M>(), waitingSeq: new Ring<number>() };
      this.tagQueues.set(tag, q);
    }
    return q;
  }

  private queueOut(recv: R, index: number, msg: M): void {
    this.outRecv.push(recv);
    this.outIndex.push(index);
    this.outMsg.push(msg);
  }

  // Hands queued matches to onMatch in order, unless an onMatch further up the stack will.
  // If onMatch throws, the rest stay queued for the next call.
  private deliver(): void {
    if (this.delivering) return;
    this.delivering = true;
    try {
      while (this.outIndex.count > 0) this.onMatch(this.outRecv.shift(), this.outIndex.shift(), this.outMsg.shift());
    } finally {
      this.delivering = false;
    }
  }

  private take(recv: R, n: number): Rec<R> {
    let rec: Rec<R>;
    if (this.free.length > 0) rec = this.pool[this.free.pop() as number];
    else {
      rec = { id: this.pool.length, recv: undefined, n: 0, tags: new Array(MAX_ENTRIES).fill(0), used: 0, left: 0, prev: undefined, next: undefined };
      this.pool.push(rec);
    }
    rec.recv = recv;
    rec.n = rec.left = n;
    rec.used = 0;
    return rec;
  }

  private release(rec: Rec<R>): void {
    rec.recv = undefined;
    this.free.push(rec.id);
  }

  private link(rec: Rec<R>): void {
    rec.prev = this.last;
    rec.next = undefined;
    if (this.last) this.last.next = rec;
    else this.first = rec;
    this.last = rec;
    this.nPosted++;
  }

  private unlink(rec: Rec<R>): void {
    if (rec.prev) rec.prev.next = rec.next;
    else this.first = rec.next;
    if (rec.next) rec.next.prev = rec.prev;
    else this.last = rec.prev;
    rec.prev = rec.next = undefined;
    this.nPosted--;
  }
}
