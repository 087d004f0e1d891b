// Frames on a link's control lane. Every frame is 24 bytes, little-endian:
//   u8 type, u8 flags, u16 zero, i32 tag, f64 seq, f64 size
// sender -> receiver: MSG (a message header; payload follows inline when EAGER), CLOSE
// receiver -> sender: ACK (every message up to seq was matched), NACK (seq failed; size is
// the receive's size), CLOSE
// either way: HEARTBEAT, sent by a side that wrote nothing for a while, so that its peer can
// tell a quiet link from a dead one
export const FRAME_BYTES = 24;

export const enum FrameType {
  MSG = 1,
  ACK = 2,
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

/** The frame in buf, or a string saying what is wrong with it. */
export function decodeFrame(buf: Uint8Array): Frame | string {
  if (buf.length < FRAME_BYTES) return `a frame of ${buf.length} bytes, expected ${FRAME_BYTES}`;
  const dv = new DataView(buf.buffer, buf.byteOffset, FRAME_BYTES);
  const type = dv.getUint8(0);
  const f: Frame = {
    type,
    flags: dv.getUint8(1),
    tag: dv.getInt32(4, true),
    seq: dv.getFloat64(8, true),
    size: dv.getFloat64(16, true),
  };
  if (type < FrameType.MSG || type > FrameType.HEARTBEAT) return `unknown frame type ${type}`;
  if (dv.getUint16(2, true) !== 0) return 'reserved bytes are not zero';
  if (!Number.isSafeInteger(f.seq) || f.seq < -1) return `bad sequence number ${f.seq}`;
  if (!Number.isSafeInteger(f.size) || f.size < 0) return `bad size ${f.size}`;
  return f;
}
