// Matching on the receive side. Messages match posted receives in FIFO order; a tag only
// picks which buffer of the first posted multi-receive a message lands in. A receive of n
// buffers takes the next n messages.
export interface RecvBuffer {
  size: number;
  tag: number;
}

export interface PostedRecv<B extends RecvBuffer = RecvBuffer> {
  slot: number;
  bufs: B[];
  /** Buffers already given a message. */
  assigned: boolean[];
  /** Buffers whose message has fully arrived. */
  arrived: number;
  /** Sizes to report, one per buffer. */
  sizes: number[];
  /** Set once the receive failed: it absorbs its remaining messages, then is reported. */
  failed: boolean;
  /** The result code it is reported with once failed. */
  code: number;
}

export type MatchResult =
  | { ok: true; index: number }
  | { ok: false; index: number; reason: string };

export function newPostedRecv<B extends RecvBuffer>(slot: number, bufs: B[]): PostedRecv<B> {
  return { slot, bufs, assigned: bufs.map(() => false), arrived: 0, sizes: bufs.map(() => 0), failed: false, code: 0 };
}

/**
 * Gives a message (tag, size) a buffer of recv. The first unassigned buffer with that tag
 * wins; with none, the first unassigned buffer takes the message and the match fails.
 * A message larger than its buffer fails too. Either way the buffer counts as assigned.
 */
export function assign(recv: PostedRecv, tag: number, size: number): MatchResult {
  let index = recv.bufs.findIndex((b, i) => !recv.assigned[i] && b.tag === tag);
  if (index < 0) {
    index = recv.assigned.indexOf(false);
    if (index < 0) throw new Error('assign: the receive has no free buffer');
    recv.assigned[index] = true;
    const tags = recv.bufs.map((b) => b.tag).join(', ');
    return { ok: false, index, reason: `a message with tag ${tag} matches none of the receive's tags (${tags})` };
  }
  recv.assigned[index] = true;
  recv.sizes[index] = size;
  const room = recv.bufs[index].size;
  if (size > room)
    return { ok: false, index, reason: `a ${size}-byte send does not fit the ${room}-byte receive (tag ${tag})` };
  return { ok: true, index };
}

/** True once every buffer of recv has been given a message. */
export const fullyAssigned = (recv: PostedRecv) => recv.assigned.every(Boolean);
