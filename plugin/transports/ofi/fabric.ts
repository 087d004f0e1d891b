// What the libfabric transport's protocol needs from the native engine, and what it gives the
// plugin. Per protocol thread and per NIC there is one FI_EP_RDM endpoint (a Rail), shared by
// every comm that thread runs on that NIC; immediate data and message headers therefore name
// the comm. Operations are posted asynchronously and never fail synchronously (the native
// side queues on -FI_EAGAIN); their completions come back in batches, one rail at a time.
// The native mapping is one libfabric call per method (see docs/rdma-protocol.md).
import type { NetError } from '../../errors';
import type { DmaBuf } from '../../memory';

/** Completion flags, as libfabric's FI_SEND ... FI_REMOTE_CQ_DATA (native maps the bits). */
export const enum CqFlag {
  SEND = 1,
  RECV = 2,
  WRITE = 4,
  READ = 8,
  REMOTE_WRITE = 16,
  REMOTE_CQ_DATA = 32,
}

/** A memory registration on one rail (fi_mr_reg). */
export interface Registration {
  /** fi_mr_desc, as a native handle number; 0 when the provider needs none. */
  readonly desc: number;
  /** fi_mr_key. */
  readonly key: bigint;
  /** The key's low and high 32 bits: what the data path passes (no BigInt per operation). */
  readonly keyLo: number;
  readonly keyHi: number;
  /**
   * What turns the local address of a byte of the region into its remote address (virtual
   * address or offset, per mr_mode): remote = addr + remoteDelta. A number, not a method: a
   * closure per registration is a call V8 does not inline where registrations vary, and an
   * address crossing it as a double is boxed (test/integration/tcp.test.ts, "garbage on the
   * data path": 32 bytes per receive where buffers lay below 2^30 and tsnet's own above).
   */
  readonly remoteDelta: number;
  /**
   * regMr with ipc: whether the registration is for CUDA IPC. False (with ipcWhy) when legacy
   * CUDA IPC cannot export the memory (cuMem* allocations): then it is a plain registration.
   */
  readonly ipc?: boolean;
  readonly ipcWhy?: string;
  /** The GPU the memory is on (CUDA ordinal); -1 or absent: host memory, or not known. */
  readonly device?: number;
  /** Registered through a DMA-BUF (FI_MR_DMABUF). */
  readonly dmabuf?: boolean;
}

/** Registered host memory that the transport owns (bounce, mailbox, flush lines). */
export interface HostBuffer {
  readonly addr: number;
  readonly bytes: Uint8Array;
  readonly reg: Registration;
}

/** One RDM endpoint on one NIC, with its completion queue and address vector. */
export interface Rail {
  /** Endpoint address (fi_getname), at most 64 bytes. */
  readonly name: Uint8Array;
  /** This rail's position among its device's rails (a NIC that OFI_NCCL_FORCE_NUM_RAILS repeats has several). */
  readonly index: number;
  /** fi_av_insert: the peer id that names this address in later calls. Inserting the same name twice may return the same id. */
  insertPeer(name: Uint8Array): number;
  /**
   * fi_mr_reg with FI_SEND|FI_RECV|FI_READ|FI_WRITE|FI_REMOTE_READ|FI_REMOTE_WRITE; throws
   * NetError on failure. ipc (GPU memory only): with FI_HMEM_DEVICE_ONLY, so that shm moves it
   * by CUDA IPC; such a registration must not be the local side of an operation with this
   * process itself (Region.localRegs). dmabuf: register through that DMA-BUF (regMrDmaBuf),
   * during this call only.
   */
  regMr(addr: number, len: number, kind: 'host' | 'cuda', ipc?: boolean, dmabuf?: DmaBuf): Registration;
  deregMr(reg: Registration): void;
  /** Registered, page-aligned host memory. */
  alloc(bytes: number): HostBuffer;
  /** Deregisters and frees what alloc gave. */
  free(buf: HostBuffer): void;
  /** fi_recv into buf[offset, offset+len). */
  postRecv(buf: HostBuffer, offset: number, len: number, token: number): void;
  // The operations take every address as hi, lo: addr = hi * ADDR_SPLIT + lo (plugin/addr.ts,
  // hiOf and loOf), two small integers, never a number V8 boxes to pass it.
  /** fi_senddata (imm >= 0) or fi_send (imm -1) of [addr, addr+len). desc 0: none. */
  send(peer: number, hi: number, lo: number, len: number, desc: number, imm: number, token: number): void;
  /** fi_sendmsg with two iovecs (a header, then the payload) and FI_REMOTE_CQ_DATA when imm >= 0. */
  send2(peer: number, hi0: number, lo0: number, len0: number, desc0: number, hi1: number, lo1: number, len1: number, desc1: number, imm: number, token: number): void;
  /**
   * fi_writedata (imm >= 0) or fi_write (imm -1) into the peer's [raddr, raddr+len). immHi: the
   * high 32 bits of the immediate data, where the provider carries 8 bytes of it (cqDataBytes).
   */
  write(peer: number, hi: number, lo: number, len: number, desc: number, rhi: number, rlo: number, keyLo: number, keyHi: number, imm: number, token: number, immHi?: number): void;
  /** fi_read of the peer's [raddr, raddr+len) into [addr, addr+len). */
  read(peer: number, hi: number, lo: number, len: number, desc: number, rhi: number, rlo: number, keyLo: number, keyHi: number, token: number): void;
  /** fi_info: tx_attr.inject_size, ep_attr.max_msg_size, domain_attr.cq_data_size. */
  readonly injectSize: number;
  readonly maxMsgSize: number;
  readonly cqDataBytes: number;
  /** FI_RX_CQ_DATA: a remote write with immediate data consumes a posted receive. */
  readonly rxCqData: boolean;
  /**
   * FI_SOURCE granted: the completion of a message names its sender (Completion.src). Absent or
   * false: completions name none.
   */
  readonly source?: boolean;
  /** source, and the completion of a remote write with immediate data names its sender too. */
  readonly sourceWrites?: boolean;
}

/** One completion-queue entry (fi_cq_data_entry, or fi_cq_err_entry when status < 0). */
export interface Completion {
  /** The token the operation was posted with (op_context); 0 for a remote write that consumed no receive. */
  token: number;
  /** 0, or -errno (FI_E* values are errno values). */
  status: number;
  /** CqFlag bits. */
  flags: number;
  /** Bytes received, or written by a remote write with immediate data (0 where the provider does not say: tcp). */
  len: number;
  /** Immediate data (with REMOTE_CQ_DATA), else 0. */
  imm: number;
  /** Its high 32 bits, where the provider carries 8 bytes; else 0. */
  immHi?: number;
  /**
   * Rails with source: the sender of a message (and with sourceWrites, of a remote write), as
   * its id in this rail's address vector (insertPeer's numbers); -1 when the sender is not in
   * it (FI_ADDR_NOTAVAIL) or the completion is an error.
   */
  src?: number;
  /** The provider's words for an error (fi_cq_strerror). */
  error?: string;
  /** TSNET_TRACE: when the I/O thread read it (µs, CLOCK_MONOTONIC), else 0; and which I/O thread. */
  time?: number;
  io?: number;
}

/**
 * The engine calls this once per batch of completions of one rail. A remote write with
 * immediate data carries token 0 unless it consumed a posted receive (providers with
 * FI_RX_CQ_DATA: then it carries that receive's token and REMOTE_CQ_DATA).
 */
export type OnCompletions = (rail: Rail, batch: readonly Completion[]) => void;

/** A registered region of NCCL's memory, as the plugin resolved it. */
export interface Region {
  readonly id: number;
  readonly base: number;
  readonly size: number;
  /** A host-memory view; null for GPU memory. */
  readonly bytes: Uint8Array | null;
  readonly kind: 'host' | 'cuda';
  /** One registration per rail (physical NIC) of the device. */
  readonly regs: Registration[];
  /**
   * TSNET_OFI_GPU_IPC: regs are FI_HMEM_DEVICE_ONLY registrations, and these plain ones are the
   * local side of the operations whose peer is this process (eager copies into the region).
   */
  readonly localRegs?: Registration[];
}

/** The registrations of region for an operation whose peer is this process (never CUDA IPC ones). */
export const ownRegs = (region: Region): readonly Registration[] => region.localRegs ?? region.regs;

/** One buffer of a request: bytes [offset, offset+size) of region (null only with size 0). */
export interface ReqBuf {
  region: Region | null;
  offset: number;
  size: number;
  tag: number;
}

/** sizes: n values for irecv, [size] for isend, [] for iflush; may be a reused array. */
export type Complete = (slot: number, code: number, sizes: ArrayLike<number>) => void;

/** TSNET_TRACE's view of a comm's requests: steps seen on an I/O thread (plugin/trace.ts). */
export interface StepTrace {
  step(slot: number, what: string, us: number, io: number): void;
}

export interface SendComm {
  isend(slot: number, buf: ReqBuf): void;
  /** Set when tracing. */
  trace?: StepTrace;
  /** Requests posted and not yet completed. */
  readonly pending: number;
  /** Heartbeats and the dead-peer check (judge: as Transport.tick's). */
  tick(now: number, timeoutMs: number, judge?: boolean): void;
  /** Drops every pending request (no completions); nothing of this comm reaches another. */
  close(): void;
  /** Completes every pending request, and every later one, with err's code. */
  fail(err: NetError): void;
  /** Set once the comm failed or closed. */
  readonly failed: NetError | undefined;
}

export interface RecvComm {
  irecv(slot: number, bufs: ReqBuf[]): void;
  /** Set when tracing. */
  trace?: StepTrace;
  iflush(slot: number, bufs: ReqBuf[]): void;
  readonly pending: number;
  tick(now: number, timeoutMs: number, judge?: boolean): void;
  close(): void;
  fail(err: NetError): void;
  readonly failed: NetError | undefined;
}
