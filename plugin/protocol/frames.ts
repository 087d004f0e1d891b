// Frames on a link's control lane. Every frame is 24 bytes, little-endian:
//   u8 type, u8 flags, u16 zero, i32 tag, f64 seq, f64 size
// sender -> receiver: MSG (a message header; its payload follows inline when EAGER)
// receiver -> sender: NACK (message seq did not fit its receive; size is the receive's size)
// either way: CLOSE (the comm was closed), HEARTBEAT (a side that wrote nothing for a while,
// so that its peer can tell a quiet link from a dead one)
import { copyBytes } from '../arrays';
import type { RxRing } from './link';

export const FRAME_BYTES = 24;

export const enum FrameType {
  MSG = 1,
  // 2 was ACK in protocol version 1 (a send completed once it had arrived)
  NACK = 3,
  CLOSE = 4,
  HEARTBEAT = 5,
}

export const FLAG_EAGER = 1;

export interface Frame {
  type: FrameType;
  flags: number;
  tag: number;
  seq: number;
  size: number;
}

/** Writes a frame into out (24 bytes). */
export function encodeFrame(f: Frame, out: Uint8Array = new Uint8Array(FRAME_BYTES)): Uint8Array {
  const dv = new DataView(out.buffer, out.byteOffset, FRAME_BYTES);
  dv.setUint8(0, f.type);
  dv.setUint8(1, f.flags);
  dv.setUint16(2, 0, true);
  dv.setInt32(4, f.tag, true);
  dv.setFloat64(8, f.seq, true);
  dv.setFloat64(16, f.size, true);
  return out;
}

function check(f: Frame, reserved: number): string | undefined {
  if (f.type !== FrameType.MSG && (f.type < FrameType.NACK || f.type > FrameType.HEARTBEAT)) return `unknown frame type ${f.type}`;
  if (reserved !== 0) return 'reserved bytes are not zero';
  if (!Number.isSafeInteger(f.seq) || f.seq < -1) return `bad sequence number ${f.seq}`;
  if (!Number.isSafeInteger(f.size) || f.size < 0) return `bad size ${f.size}`;
  return undefined;
}

/** The frame in buf, or a string saying what is wrong with it. */
export function decodeFrame(buf: Uint8Array): Frame | string {
  if (buf.length < FRAME_BYTES) return `a frame of ${buf.length} bytes, expected ${FRAME_BYTES}`;
  const dv = new DataView(buf.buffer, buf.byteOffset, FRAME_BYTES);
  const f: Frame = { type: dv.getUint8(0), flags: dv.getUint8(1), tag: dv.getInt32(4, true), seq: dv.getFloat64(8, true), size: dv.getFloat64(16, true) };
  return check(f, dv.getUint16(2, true)) ?? f;
}

const split = new Uint8Array(FRAME_BYTES);
const splitView = new DataView(split.buffer);

/**
 * Decodes the frame at ring position `at` (modulo 2^32) into out, without allocating; a frame
 * may wrap around the ring's end. Returns what is wrong with it, or undefined.
 */
export function readFrame(rx: RxRing, at: number, out: Frame): string | undefined {
  const o = at & rx.mask;
  if (o + FRAME_BYTES <= rx.mask + 1) return decode(rx.view, o, out);
  for (let i = 0; i < FRAME_BYTES; i++) split[i] = rx.bytes[(at + i) & rx.mask];
  return decode(splitView, 0, out);
}

// One function decodes from either view: readFrame choosing the view in place made V8 throw
// its compiled code away at the first frame that wrapped round the ring (performance.md, item 16).
function decode(dv: DataView, o: number, out: Frame): string | undefined {
  out.type = dv.getUint8(o);
  out.flags = dv.getUint8(o + 1);
  out.tag = dv.getInt32(o + 4, true);
  out.seq = dv.getFloat64(o + 8, true);
  out.size = dv.getFloat64(o + 16, true);
  return check(out, dv.getUint16(o + 2, true));
}

/** Copies len bytes at ring position `at` into dst at offset (the payload may wrap). */
export function copyOut(rx: RxRing, at: number, len: number, dst: Uint8Array, offset: number): void {
  const o = at & rx.mask;
  const first = Math.min(len, rx.mask + 1 - o);
  copyBytes(dst, offset, rx.bytes, o, first);
  if (len > first) copyBytes(dst, offset + first, rx.bytes, 0, len - first);
}
