/** ABI versions tsnet exports, oldest first; a new NCCL version is appended here. */
export const ABI_VERSIONS = [6, 7, 8, 9, 10, 11, 12] as const;

/** One of the exported ncclNet ABI versions. */
export type AbiVersion = (typeof ABI_VERSIONS)[number];
