// Lane policy: the data lane of a message's first stripe (stripe k goes to lane first + k).
// Both ends keep the same counter: it advances by each message's stripe count.

export interface LanePolicy {
  readonly id: number;
  readonly name: string;
  /** The lane of the first stripe, from the link's stripe counter and the message's tag. */
  first(counter: number, tag: number, lanes: number): number;
}

/** Round robin: a message starts where the previous one ended, so lanes share the load. */
export const roundRobin: LanePolicy = {
  id: 1,
  name: 'roundrobin',
  first: (counter, _tag, lanes) => counter % lanes,
};

/** By tag (NCCL's peer rank): a peer's messages start on the same lane. */
export const byTag: LanePolicy = {
  id: 2,
  name: 'tag',
  first: (_counter, tag, lanes) => ((tag % lanes) + lanes) % lanes,
};
