// Matching on the sender, against the receive entries it learns of from control messages.
// The rule (shared with TCP's receiver-side matcher): a send goes to the earliest posted
// receive, in posting order, that has an unused entry with its tag; equal tags keep their
// order; sends with different tags may match out of order. A send that matches no known
// receive waits, in send order, for the next control messages.
//
// The comm only calls post/arrive/clear and is told of matches through MatchSink; the
// matching itself is plugin/protocol/matching.ts's, the one place the rule lives.
import { objectArray } from '../../arrays';
import { MAX_ENTRIES, Matcher, type RecvEntry } from '../../protocol/matching';

export interface MatchSink<S> {
  /** send takes entry `index` of receive `recv`. */
  onMatch(send: S, recv: number, index: number): void;
  /** Every entry of receive `recv` is taken: its control message is no longer needed. */
  onFull(recv: number): void;
}

export interface SendMatcher<S> {
  /** Receives posted so far: the sequence number the next post must carry. */
  readonly known: number;
  /** Sends that wait for a receive. */
  readonly queued: number;
  /** The earliest receive that may still have an unused entry (its control message is still needed). */
  readonly oldest: number;
  /** Receive `recv` (== known) with n entries tagged tags[0..n): matches waiting sends, in send order. */
  post(recv: number, n: number, tags: ArrayLike<number>): void;
  /** A new send; true when it matched at once (onMatch has been called). */
  arrive(send: S, tag: number): boolean;
  /** Forgets every receive and send. */
  clear(): void;
}

/** Receives that can have unused entries at once: the control mailbox's slots. */
const WINDOW = 256;

/**
 * The sender's matcher: plugin/protocol/matching.ts's Matcher (the one rule, shared with the
 * TCP receiver) with receives named by their sequence numbers, plus what the control mailbox
 * needs to know: how many receives were announced and the oldest one still open.
 */
export class SharedSendMatcher<S> implements SendMatcher<S> {
  known = 0;
  private head = 0; // oldest receive that may have an unused entry
  private readonly left = new Uint8Array(WINDOW); // unused entries per receive
  private readonly matcher: Matcher<number, S>;
  // Entry lists handed to Matcher.post, one per length, reused (only their tags change).
  private readonly entries: RecvEntry[][] = objectArray();

  constructor(private readonly sink: MatchSink<S>) {
    this.matcher = new Matcher<number, S>((recv, index, send) => this.matched(recv, index, send));
    for (let n = 0; n <= MAX_ENTRIES; n++) this.entries.push(Array.from({ length: n }, () => ({ size: 0, tag: 0 })));
  }

  get queued(): number {
    return this.matcher.waiting;
  }

  get oldest(): number {
    return this.head;
  }

  post(recv: number, n: number, tags: ArrayLike<number>): void {
    if (recv !== this.known) throw new Error(`matcher: receive ${recv} posted, expected ${this.known}`);
    if (recv - this.head >= WINDOW) throw new Error(`matcher: more than ${WINDOW} receives with unused entries`);
    const entries = this.entries[n];
    if (!entries || n < 1) throw new RangeError(`matcher: a receive has 1 to ${MAX_ENTRIES} entries, not ${n}`);
    for (let i = 0; i < n; i++) entries[i].tag = tags[i];
    this.left[recv % WINDOW] = n;
    this.known = recv + 1;
    this.matcher.post(recv, entries);
  }

  arrive(send: S, tag: number): boolean {
    const waiting = this.matcher.waiting;
    this.matcher.arrive(send, tag);
    return this.matcher.waiting === waiting;
  }

  clear(): void {
    this.matcher.clear();
    this.head = this.known;
  }

  private matched(recv: number, index: number, send: S): void {
    this.sink.onMatch(send, recv, index);
    if (--this.left[recv % WINDOW] > 0) return;
    this.sink.onFull(recv);
    while (this.head < this.known && this.left[this.head % WINDOW] === 0) this.head++;
  }
}
