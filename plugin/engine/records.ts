// The records shared in memory with native threads (native/engine/records.h), as offsets.
// test/engine/records.test.ts compiles the C header and checks every number here.

/** A ring's header: consumer head, producer tail (each on its own cache line), then mask and record size. */
export const RING = { bytes: 192, head: 0, tail: 64, mask: 128, recordBytes: 132 } as const;

/** Submission record (protocol thread -> I/O thread). */
export const SUB = {
  bytes: 96,
  lane: 0,
  link: 4,
  op: 8,
  kind: 12,
  inlineLen: 14,
  addr: 16,
  len: 24,
  raddr: 32,
  rkeyLo: 40,
  rkeyHi: 44,
  imm: 48,
  flags: 52,
  aux: 56,
  mr: 60,
  inl: 64,
  inlineMax: 32,
} as const;

export const enum SubKind {
  WRITE = 1,
  READ = 2,
  DISCARD = 3,
  RX_RESUME = 4,
  OFI_RECV = 16,
  OFI_SEND = 17,
  OFI_WRITE = 18,
  OFI_READ = 19,
}

export const SUB_F_NOCQE = 1;
export const SUB_F_IMM = 2;

/** Completion record (I/O thread -> protocol thread). */
export const CQE = { bytes: 48, link: 0, op: 4, status: 8, imm: 12, value: 16, flags: 24, immHi: 28, time: 32, src: 40 } as const;
/** A completion record's src when the sender is not known (read as int32: -1). */
export const CQE_NO_SRC = 0xffffffff;

/** The op of a receive-ring notification: value is the lane's receive counter. */
export const CQE_RX = 0xffffffff;
/** The op of a peer's remote write with immediate data (libfabric lanes). */
export const CQE_REMOTE = 0xfffffffe;
/**
 * CQE_RX and CQE_REMOTE as the port reads a record's op (int32) and hands it to a link
 * (CqeHandler.onOp): -1 and -2, small integers to V8, where 0xfffffffe was boxed at each call
 * (16 bytes per peer's write). Links' own tokens stay below 2^30 (protocol/sender.ts,
 * protocol/receiver.ts, transports/ofi/bounce.ts), so they read the same either way.
 */
export const OP_RX = CQE_RX | 0;
export const OP_REMOTE = CQE_REMOTE | 0;
/** Completion flags of libfabric lanes. */
export const enum CqeFlag {
  SEND = 1,
  RECV = 2,
  WRITE = 4,
  READ = 8,
  REMOTE_WRITE = 16,
  DATA = 32,
}
export const STATUS_OK = 0;
export const STATUS_EOF = -1000;

/** A control lane's receive ring header, before its bytes. */
export const RX = { bytes: 192, written: 0, consumed: 64, stalled: 128, capacity: 132 } as const;

/** One request slot's status (int32s): state, result, sizes[8]. */
export const SLOT = { ints: 10, state: 0, result: 1, sizes: 2 } as const;
export const enum SlotState {
  FREE = 0,
  POSTED = 1,
  DONE = 2,
  FAILED = 3,
}

/** Posted-request mailbox records, in doubles: op, comm, slot, n, posted-at, taken-at, warm-up mark, then 4 per buffer. */
export const POST = { head: 7, buf: 4 } as const;
