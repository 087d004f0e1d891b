// The libfabric transport's bytes on the wire (docs/rdma-protocol.md has the tables).
// All integers are little-endian.
//
// immediate data of a remote write (32 bits):
//   bits 0-9 message sequence mod 1024 | 10-24 comm id | 25-27 sub-receive index | 28-31 segments
//   segments 1..14: a data segment of that many; 0: a control message (index = n - 1);
//   15 into a receive comm: the send did not fit its sub-receive (0 bytes written);
//   15 into a send comm: receive `sequence` is complete and fenced (CUDA IPC acknowledgement);
//   with 8 bytes of immediate data its high 32 bits acknowledge more: bit j receive sequence - 1 - j
// immediate data of a two-sided message (32 bits): bits 0-14 comm or listener id | 15-17 kind
//   | 18-31 zero, except CLOSE: the low 14 bits of the connection's connector nonce
// handle (80 bytes): u32 'TSNO', u16 version, u8 name length, u8 NICs, u16 listener id, u16 0,
//   u32 nonce, 64-byte rail-0 endpoint name
// CONNECT (<= 352 bytes) and ACCEPT (<= 312 bytes): see encodeConnect / encodeAccept; a refusal
//   is an ACCEPT header with a status (encodeRefusal)
// control entry (64 bytes, one per sub-receive): see ENTRY_* word offsets
// eager header (8 bytes): u16 eager ordinal, u16 base receive sequence, i32 tag
import { invalidArgument } from '../../errors';
import { MAX_RAILS } from './config';

export const PROTOCOL_VERSION = 6;
export const NAME_BYTES = 64;

// ---- immediate data ----------------------------------------------------------------------

export const SEQ_BITS = 10;
export const SEQ_MASK = (1 << SEQ_BITS) - 1;
export const COMM_BITS = 15;
/** Comm ids per endpoint: 1 .. MAX_COMMS - 1 (0 is never used). */
export const MAX_COMMS = 1 << COMM_BITS;
export const COMM_MASK = MAX_COMMS - 1;
export const SEGS_CTRL = 0;
export const SEGS_TOO_BIG = 15;
/**
 * The same value into a send comm: the receive named by the sequence is complete and fenced;
 * where the provider carries 8 bytes of immediate data, bit j of the high half acknowledges
 * receive sequence - 1 - j as well (ACK_SPAN receives before it).
 */
export const SEGS_ACK = 15;
export const ACK_SPAN = 32;

export const immWrite = (comm: number, seq: number, index: number, segs: number): number =>
  ((seq & SEQ_MASK) | (comm << 10) | (index << 25) | (segs << 28)) >>> 0;
export const immSeq = (imm: number): number => imm & SEQ_MASK;
export const immComm = (imm: number): number => (imm >>> 10) & COMM_MASK;
export const immIndex = (imm: number): number => (imm >>> 25) & 7;
export const immSegs = (imm: number): number => imm >>> 28;

export const enum MsgKind {
  EAGER = 1,
  CONNECT = 2,
  ACCEPT = 3,
  HEARTBEAT = 4,
  /** 0 bytes: the peer closed its comm (bits 18-31: closeMark of the connection). */
  CLOSE = 5,
}

export const immMsg = (kind: MsgKind, id: number): number => (id | (kind << 15)) >>> 0;
export const msgId = (imm: number): number => imm & COMM_MASK;
export const msgKind = (imm: number): number => (imm >>> 15) & 7;
/** What a CLOSE carries besides the comm id: 14 bits of the connector's nonce, so that a late CLOSE does not reach a later comm with the same id. */
export const closeMark = (connectorNonce: number): number => connectorNonce & 0x3fff;
export const immClose = (id: number, connectorNonce: number): number => (immMsg(MsgKind.CLOSE, id) | (closeMark(connectorNonce) << 18)) >>> 0;
export const immCloseMark = (imm: number): number => imm >>> 18;

// ---- sequence numbers ---------------------------------------------------------------------

/** The full number nearest at or after `from` whose low `bits` bits are `low`. */
export const unwrapAfter = (from: number, low: number, bits: number): number => from + ((low - from) & ((1 << bits) - 1));
/** The full number at or before `upto` whose low `bits` bits are `low`. */
export const unwrapBefore = (upto: number, low: number, bits: number): number => upto - ((upto - low) & ((1 << bits) - 1));

// ---- control entries ----------------------------------------------------------------------

/** A control message is up to 8 entries of 64 bytes; a mailbox slot holds the largest. */
export const MAX_RECVS = 8;
export const ENTRY_BYTES = 64;
export const SLOT_BYTES = MAX_RECVS * ENTRY_BYTES;
/** Mailbox slots per send comm (control messages indexed by receive sequence mod 256). */
export const MAILBOX_SLOTS = 256;

// Entry layout in 32-bit words (an entry starts at a multiple of 16 words).
export const ENTRY_ADDR_LO = 0; // remote address of the buffer (rail 0's view; every rail agrees)
export const ENTRY_ADDR_HI = 1;
export const ENTRY_SIZE = 2; // buffer bytes (u32)
export const ENTRY_TAG = 3; // i32
export const ENTRY_MARK = 4; // u16 receive sequence mod 65536 | u8 n << 16 | u8 index << 24
export const ENTRY_FLAGS = 5; // zero (reserved)
export const ENTRY_KEYS = 6; // MAX_RAILS x (key lo, key hi), one per rail of the comm
export const ENTRY_WORDS = 16;

export const entryMark = (seq: number, n: number, index: number): number => ((seq & 0xffff) | (n << 16) | (index << 24)) >>> 0;

// ---- eager header -------------------------------------------------------------------------

export const EAGER_ORDINAL_BITS = 16;
export const EAGER_BASE_BITS = 16;

// ---- handle -------------------------------------------------------------------------------

export const HANDLE_MAGIC = 0x4f4e5354; // bytes 'TSNO'
export const HANDLE_BYTES = 16 + NAME_BYTES;

export interface Handle {
  listener: number;
  nonce: number;
  nics: number;
  name: Uint8Array;
}

export function encodeHandle(h: Handle): Uint8Array {
  if (h.name.length > NAME_BYTES) throw invalidArgument(`an endpoint name of ${h.name.length} bytes; at most ${NAME_BYTES}`);
  const b = new Uint8Array(HANDLE_BYTES);
  const v = new DataView(b.buffer);
  v.setUint32(0, HANDLE_MAGIC, true);
  v.setUint16(4, PROTOCOL_VERSION, true);
  v.setUint8(6, h.name.length);
  v.setUint8(7, h.nics);
  v.setUint16(8, h.listener, true);
  v.setUint32(12, h.nonce, true);
  b.set(h.name, 16);
  return b;
}

export function decodeHandle(b: Uint8Array): Handle {
  if (b.length < 16) throw invalidArgument(`the handle has ${b.length} bytes, fewer than its header`);
  const v = new DataView(b.buffer, b.byteOffset, b.length);
  const magic = v.getUint32(0, true);
  if (magic !== HANDLE_MAGIC) throw invalidArgument(`the handle is not a tsnet libfabric handle (magic 0x${magic.toString(16)})`);
  const version = v.getUint16(4, true);
  if (version !== PROTOCOL_VERSION) throw invalidArgument(`the handle has protocol version ${version}; this tsnet speaks ${PROTOCOL_VERSION}`);
  const len = v.getUint8(6);
  if (len === 0 || len > NAME_BYTES || b.length < 16 + len) throw invalidArgument(`the handle's endpoint name length ${len} does not fit`);
  const listener = v.getUint16(8, true);
  if (listener === 0 || listener >= MAX_COMMS) throw invalidArgument(`the handle names listener ${listener}`);
  return { listener, nonce: v.getUint32(12, true), nics: v.getUint8(7), name: b.slice(16, 16 + len) };
}

// ---- CONNECT and ACCEPT -------------------------------------------------------------------

export const CONNECT_MAGIC = 0x434e5354; // 'TSNC'
export const ACCEPT_MAGIC = 0x414e5354; // 'TSNA'
const CONNECT_HEADER = 96;
export const CONNECT_BYTES = CONNECT_HEADER + MAX_RAILS * NAME_BYTES;
/**
 * CONNECT flag: the connector's GPU memory is registered for CUDA IPC (TSNET_OFI_GPU_IPC), so a
 * written send completes only when the receiver acknowledges it (docs/rdma-protocol.md).
 */
export const CONNECT_GPU_IPC = 1;
const ACCEPT_HEADER = 56;
export const ACCEPT_BYTES = ACCEPT_HEADER + MAX_RAILS * NAME_BYTES;

/** What a connector tells the listener: its rails, comm id, mailbox, eager limit, flags and process. */
export interface Connect {
  listenerNonce: number;
  connectorNonce: number;
  comm: number;
  rails: number; // the connector's rails (after OFI_NCCL_FORCE_NUM_RAILS)
  eagerMax: number; // -1: no eager
  flags: number; // CONNECT_GPU_IPC
  pid: number; // the connector's process id (CUDA IPC needs the peer to be another process)
  start: number; // its start time in /proc (clock ticks after boot; 0: unknown): a dead peer on this host is seen by it
  boot: Uint8Array; // its kernel's boot id (16 bytes; zeros: unknown): equal to ours, the peer is on this host
  mailboxAddr: number;
  mailboxKeys: { lo: number; hi: number }[]; // one per NIC
  names: Uint8Array[]; // one per NIC
}

/**
 * Why a listener's endpoint refused a CONNECT (the status of its refusal; 0 is an ACCEPT). The
 * connector fails at once instead of waiting out TSNET_TIMEOUT_SEC.
 */
export const enum Refusal {
  LISTENER_CLOSED = 1,
  STALE_HANDLE = 2,
  TOO_MANY_WAITING = 3,
  CANNOT_ACCEPT = 4,
}

export const REFUSAL_WORDS: Record<number, string> = {
  [Refusal.LISTENER_CLOSED]: 'the listener is closed',
  [Refusal.STALE_HANDLE]: 'the handle is stale (the listener has another nonce)',
  [Refusal.TOO_MANY_WAITING]: 'too many connections wait for accept at the listener',
  [Refusal.CANNOT_ACCEPT]: 'the listener cannot make the receive comm (see its WARN)',
};

/** What the listener answers: its rails, comm id, the eager messages its bounce buffers hold, its process. */
export interface Accept {
  connectorNonce: number;
  comm: number;
  rails: number;
  eagerCapacity: number; // -1: no eager
  pid: number;
  start: number; // as in Connect
  boot: Uint8Array; // as in Connect
  names: Uint8Array[];
}

export const BOOT_ID_BYTES = 16;

function bootBytes(boot: Uint8Array): Uint8Array {
  if (boot.length !== BOOT_ID_BYTES) throw invalidArgument(`a boot id of ${boot.length} bytes; ${BOOT_ID_BYTES}`);
  return boot;
}

function checkNames(names: Uint8Array[]): number {
  if (names.length === 0 || names.length > MAX_RAILS) throw invalidArgument(`${names.length} endpoint names; 1 to ${MAX_RAILS}`);
  const len = names[0].length;
  for (const n of names) if (n.length !== len || len === 0 || len > NAME_BYTES) throw invalidArgument('endpoint names of different or bad lengths');
  return len;
}

export function encodeConnect(c: Connect, out: Uint8Array): number {
  const len = checkNames(c.names);
  const v = new DataView(out.buffer, out.byteOffset, out.length);
  out.fill(0, 0, CONNECT_BYTES);
  v.setUint32(0, CONNECT_MAGIC, true);
  v.setUint16(4, PROTOCOL_VERSION, true);
  v.setUint8(6, c.names.length);
  v.setUint8(7, c.rails);
  v.setUint32(8, c.listenerNonce, true);
  v.setUint32(12, c.connectorNonce, true);
  v.setUint16(16, c.comm, true);
  v.setUint16(18, len, true);
  v.setInt32(20, c.eagerMax, true);
  v.setUint32(24, c.mailboxAddr % 2 ** 32, true);
  v.setUint32(28, Math.floor(c.mailboxAddr / 2 ** 32), true);
  c.mailboxKeys.forEach((k, i) => {
    v.setUint32(32 + 8 * i, k.lo, true);
    v.setUint32(36 + 8 * i, k.hi, true);
  });
  v.setUint32(64, c.flags, true);
  v.setUint32(68, c.pid, true);
  v.setUint32(72, c.start % 2 ** 32, true);
  v.setUint32(76, Math.floor(c.start / 2 ** 32), true);
  out.set(bootBytes(c.boot), 80);
  c.names.forEach((n, i) => out.set(n, CONNECT_HEADER + NAME_BYTES * i));
  return CONNECT_HEADER + NAME_BYTES * c.names.length;
}

export function decodeConnect(b: Uint8Array): Connect | string {
  if (b.length < CONNECT_HEADER) return `a connect message of ${b.length} bytes`;
  const v = new DataView(b.buffer, b.byteOffset, b.length);
  if (v.getUint32(0, true) !== CONNECT_MAGIC) return 'not a connect message (bad magic)';
  if (v.getUint16(4, true) !== PROTOCOL_VERSION) return `protocol version ${v.getUint16(4, true)}; this tsnet speaks ${PROTOCOL_VERSION}`;
  const nics = v.getUint8(6);
  const rails = v.getUint8(7);
  const len = v.getUint16(18, true);
  if (nics < 1 || nics > MAX_RAILS || rails < 1 || rails > MAX_RAILS || len < 1 || len > NAME_BYTES || b.length < CONNECT_HEADER + NAME_BYTES * nics)
    return `a connect message with ${nics} NICs, ${rails} rails, names of ${len} bytes in ${b.length} bytes`;
  const comm = v.getUint16(16, true);
  if (comm === 0 || comm >= MAX_COMMS) return `a connect message from comm ${comm}`;
  const mailboxKeys = [];
  const names = [];
  for (let i = 0; i < nics; i++) {
    mailboxKeys.push({ lo: v.getUint32(32 + 8 * i, true), hi: v.getUint32(36 + 8 * i, true) });
    names.push(b.slice(CONNECT_HEADER + NAME_BYTES * i, CONNECT_HEADER + NAME_BYTES * i + len));
  }
  return {
    listenerNonce: v.getUint32(8, true),
    connectorNonce: v.getUint32(12, true),
    comm,
    rails,
    eagerMax: v.getInt32(20, true),
    flags: v.getUint32(64, true),
    pid: v.getUint32(68, true),
    start: v.getUint32(72, true) + v.getUint32(76, true) * 2 ** 32,
    boot: b.slice(80, 96),
    mailboxAddr: v.getUint32(24, true) + v.getUint32(28, true) * 2 ** 32,
    mailboxKeys,
    names,
  };
}

export function encodeAccept(a: Accept, out: Uint8Array): number {
  const len = checkNames(a.names);
  const v = new DataView(out.buffer, out.byteOffset, out.length);
  out.fill(0, 0, ACCEPT_BYTES);
  v.setUint32(0, ACCEPT_MAGIC, true);
  v.setUint16(4, PROTOCOL_VERSION, true);
  v.setUint8(6, a.names.length);
  v.setUint8(7, a.rails);
  v.setUint32(8, a.connectorNonce, true);
  v.setUint16(12, a.comm, true);
  v.setUint16(14, len, true);
  v.setInt32(16, a.eagerCapacity, true);
  v.setUint32(24, a.pid, true);
  v.setUint32(32, a.start % 2 ** 32, true);
  v.setUint32(36, Math.floor(a.start / 2 ** 32), true);
  out.set(bootBytes(a.boot), 40);
  a.names.forEach((n, i) => out.set(n, ACCEPT_HEADER + NAME_BYTES * i));
  return ACCEPT_HEADER + NAME_BYTES * a.names.length;
}

/** A refusal: the ACCEPT header with no names, the connector's nonce and a status (Refusal). */
export const REFUSAL_BYTES = ACCEPT_HEADER;

export function encodeRefusal(connectorNonce: number, status: Refusal, out: Uint8Array): number {
  const v = new DataView(out.buffer, out.byteOffset, out.length);
  out.fill(0, 0, REFUSAL_BYTES);
  v.setUint32(0, ACCEPT_MAGIC, true);
  v.setUint16(4, PROTOCOL_VERSION, true);
  v.setUint32(8, connectorNonce, true);
  v.setUint32(20, status, true);
  return REFUSAL_BYTES;
}

/** An ACCEPT, a refusal ({connectorNonce, refused: status}), or what is wrong with the message. */
export function decodeAccept(b: Uint8Array): Accept | { connectorNonce: number; refused: number } | string {
  if (b.length < ACCEPT_HEADER) return `an accept message of ${b.length} bytes`;
  const v = new DataView(b.buffer, b.byteOffset, b.length);
  if (v.getUint32(0, true) !== ACCEPT_MAGIC) return 'not an accept message (bad magic)';
  if (v.getUint16(4, true) !== PROTOCOL_VERSION) return `protocol version ${v.getUint16(4, true)}; this tsnet speaks ${PROTOCOL_VERSION}`;
  if (v.getUint32(20, true) !== 0) return { connectorNonce: v.getUint32(8, true), refused: v.getUint32(20, true) };
  const nics = v.getUint8(6);
  const rails = v.getUint8(7);
  const len = v.getUint16(14, true);
  if (nics < 1 || nics > MAX_RAILS || rails < 1 || rails > MAX_RAILS || len < 1 || len > NAME_BYTES || b.length < ACCEPT_HEADER + NAME_BYTES * nics)
    return `an accept message with ${nics} NICs, ${rails} rails, names of ${len} bytes in ${b.length} bytes`;
  const comm = v.getUint16(12, true);
  if (comm === 0 || comm >= MAX_COMMS) return `an accept message from comm ${comm}`;
  const names = [];
  for (let i = 0; i < nics; i++) names.push(b.slice(ACCEPT_HEADER + NAME_BYTES * i, ACCEPT_HEADER + NAME_BYTES * i + len));
  const start = v.getUint32(32, true) + v.getUint32(36, true) * 2 ** 32;
  return { connectorNonce: v.getUint32(8, true), comm, rails, eagerCapacity: v.getInt32(16, true), pid: v.getUint32(24, true), start, boot: b.slice(40, 56), names };
}

/** This code assumes a little-endian host (typed-array views of wire bytes). */
export const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
