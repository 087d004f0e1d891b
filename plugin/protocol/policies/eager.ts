// Eager policy: which messages travel inline after their header on the control lane (one
// write, one copy on arrival) instead of striped over the data lanes (zero-copy both ways).

export interface EagerPolicy {
  readonly id: number;
  readonly name: string;
  /** True when a message of size bytes goes inline. lanes = 0: everything goes inline. */
  eager(size: number, eagerMax: number, lanes: number): boolean;
}

/** Up to eagerMax bytes go inline (TSNET_EAGER_MAX / OFI_NCCL_EAGER_MAX_SIZE). */
export const threshold: EagerPolicy = {
  id: 1,
  name: 'threshold',
  eager: (size, eagerMax, lanes) => size <= eagerMax || lanes === 0,
};
