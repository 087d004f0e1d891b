// Control-lane frames (plugin/protocol/frames.ts): 24 bytes little-endian; encode/decode round
// trips; readFrame in place from a receive ring at every offset (a frame may wrap around the
// ring's end, positions wrap at 2^32); copyOut of payloads that wrap; malformed frames rejected
// with words saying what is wrong.
import { describe, expect, it } from 'vitest';
import { FLAG_EAGER, FRAME_BYTES, type Frame, FrameType, copyOut, decodeFrame, encodeFrame, readFrame } from '../../plugin/protocol/frames';
import type { RxRing } from '../../plugin/protocol/link';
import { fill } from './helpers';

const { MSG, NACK, CLOSE, HEARTBEAT } = { MSG: FrameType.MSG, NACK: FrameType.NACK, CLOSE: FrameType.CLOSE, HEARTBEAT: FrameType.HEARTBEAT };

/** A valid frame's bytes with one change applied. */
function bytes(change: (dv: DataView) => void, f: Frame = { type: MSG, flags: 0, tag: 1, seq: 2, size: 3 }): Uint8Array {
  const b = encodeFrame(f);
  change(new DataView(b.buffer, b.byteOffset, FRAME_BYTES));
  return b;
}

/** A receive ring of capacity bytes (a power of two), filled with garbage. */
function ring(capacity: number): RxRing & { put(at: number, src: Uint8Array): void } {
  const b = fill(new Uint8Array(capacity), 99);
  return {
    bytes: b,
    view: new DataView(b.buffer),
    mask: capacity - 1,
    written: () => 0,
    release: () => {},
    /** Writes src at ring position at (modulo 2^32), wrapping around the end. */
    put(at: number, src: Uint8Array) {
      for (let i = 0; i < src.length; i++) b[(at + i) & (capacity - 1)] = src[i];
    },
  };
}

const FRAMES: Frame[] = [
  { type: MSG, flags: 0, tag: 0, seq: 0, size: 0 },
  { type: MSG, flags: FLAG_EAGER, tag: 7, seq: 1, size: 16384 },
  { type: MSG, flags: 0, tag: -1, seq: 123456789, size: 8 * 1024 * 1024 },
  { type: MSG, flags: 0, tag: 2147483647, seq: 2 ** 40, size: 2 ** 40 },
  { type: MSG, flags: 0, tag: -2147483648, seq: Number.MAX_SAFE_INTEGER, size: Number.MAX_SAFE_INTEGER },
  { type: NACK, flags: 0, tag: 0, seq: 3, size: 100 },
  { type: CLOSE, flags: 0, tag: 0, seq: -1, size: 0 },
  { type: HEARTBEAT, flags: 0, tag: 0, seq: -1, size: 0 },
];

describe('encodeFrame / decodeFrame', () => {
  it('frames are 24 bytes', () => {
    expect(FRAME_BYTES).toBe(24);
    expect(encodeFrame({ type: MSG, flags: 0, tag: 0, seq: 0, size: 0 }).length).toBe(24);
  });

  it.each(FRAMES)('round trip %j', (f) => {
    expect(decodeFrame(encodeFrame(f))).toEqual(f);
  });

  it('lays fields out little-endian: u8 type, u8 flags, u16 zero, i32 tag, f64 seq, f64 size', () => {
    const b = encodeFrame({ type: NACK, flags: FLAG_EAGER, tag: -2, seq: 5, size: 4096 });
    const dv = new DataView(b.buffer);
    expect(b[0]).toBe(3);
    expect(b[1]).toBe(1);
    expect(dv.getUint16(2, true)).toBe(0);
    expect([...b.subarray(4, 8)]).toEqual([0xfe, 0xff, 0xff, 0xff]);
    expect(dv.getFloat64(8, true)).toBe(5);
    expect(dv.getFloat64(16, true)).toBe(4096);
  });

  it('encodes into and decodes from a view at an offset of a larger buffer', () => {
    const big = new Uint8Array(100).fill(0xaa);
    const f: Frame = { type: MSG, flags: FLAG_EAGER, tag: 9, seq: 77, size: 12345 };
    const out = encodeFrame(f, big.subarray(40, 64));
    expect(out.byteOffset).toBe(40);
    expect(decodeFrame(big.subarray(40, 64))).toEqual(f);
    expect(big.subarray(0, 40).every((x) => x === 0xaa)).toBe(true);
    expect(big.subarray(64).every((x) => x === 0xaa)).toBe(true);
  });

  it('overwrites stale bytes of a reused buffer (reserved bytes included)', () => {
    const out = new Uint8Array(FRAME_BYTES).fill(0xff);
    const f: Frame = { type: NACK, flags: 0, tag: 0, seq: 1, size: 0 };
    expect(decodeFrame(encodeFrame(f, out))).toEqual(f);
  });

  it('a buffer shorter than a frame is rejected with words, not an exception', () => {
    const short = encodeFrame({ type: MSG, flags: 0, tag: 0, seq: 0, size: 0 }).subarray(0, 10);
    expect(decodeFrame(short)).toBe('a frame of 10 bytes, expected 24');
  });
});

describe('malformed frames', () => {
  const CASES: [string, (dv: DataView) => void, string][] = [
    ['type 0', (dv) => dv.setUint8(0, 0), 'unknown frame type 0'],
    ['type 2 (the ACK of protocol version 1)', (dv) => dv.setUint8(0, 2), 'unknown frame type 2'],
    ['type 6', (dv) => dv.setUint8(0, 6), 'unknown frame type 6'],
    ['type 255', (dv) => dv.setUint8(0, 255), 'unknown frame type 255'],
    ['reserved byte 2 set', (dv) => dv.setUint8(2, 1), 'reserved bytes are not zero'],
    ['reserved byte 3 set', (dv) => dv.setUint8(3, 0x80), 'reserved bytes are not zero'],
    ['seq NaN', (dv) => dv.setFloat64(8, NaN, true), 'bad sequence number NaN'],
    ['seq -2', (dv) => dv.setFloat64(8, -2, true), 'bad sequence number -2'],
    ['seq 1.5', (dv) => dv.setFloat64(8, 1.5, true), 'bad sequence number 1.5'],
    ['seq 2^53', (dv) => dv.setFloat64(8, 2 ** 53, true), `bad sequence number ${2 ** 53}`],
    ['seq Infinity', (dv) => dv.setFloat64(8, Infinity, true), 'bad sequence number Infinity'],
    ['size -1', (dv) => dv.setFloat64(16, -1, true), 'bad size -1'],
    ['size 0.5', (dv) => dv.setFloat64(16, 0.5, true), 'bad size 0.5'],
    ['size NaN', (dv) => dv.setFloat64(16, NaN, true), 'bad size NaN'],
    ['size Infinity', (dv) => dv.setFloat64(16, Infinity, true), 'bad size Infinity'],
    ['size 2^60', (dv) => dv.setFloat64(16, 2 ** 60, true), `bad size ${2 ** 60}`],
  ];

  it.each(CASES)('%s: decodeFrame says what is wrong', (_what, change, words) => {
    expect(decodeFrame(bytes(change))).toBe(words);
  });

  it.each(CASES)('%s: readFrame says the same, the frame wrapping the ring\'s end or not', (_what, change, words) => {
    const rx = ring(64);
    const out: Frame = { type: MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    for (const at of [0, 5, 50, 63]) {
      rx.put(at, bytes(change));
      expect(readFrame(rx, at, out)).toBe(words);
    }
  });

  it('all-zero bytes (an empty read) and garbage are rejected', () => {
    expect(decodeFrame(new Uint8Array(FRAME_BYTES))).toBe('unknown frame type 0');
    const junk = new Uint8Array(FRAME_BYTES);
    for (let i = 0; i < junk.length; i++) junk[i] = (i * 97 + 13) & 0xff;
    expect(typeof decodeFrame(junk)).toBe('string');
  });
});

describe('readFrame', () => {
  it.each([32, 64, 256])('decodes a frame at every offset of a %i-byte ring, wrapping around its end', (capacity) => {
    const rx = ring(capacity);
    const out: Frame = { type: MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    FRAMES.forEach((f, k) => {
      for (let o = 0; o < capacity; o++) {
        // Positions count bytes modulo 2^32: the same offset from several laps, the last near 2^32.
        for (const lap of [0, 1, 7, Math.floor(2 ** 32 / capacity) - 1]) {
          const at = (lap * capacity + o) >>> 0;
          rx.put(at, encodeFrame(f));
          expect(readFrame(rx, at, out), `frame ${k} at ${at}`).toBeUndefined();
          expect(out, `frame ${k} at ${at}`).toEqual(f);
        }
      }
    });
  });

  it('a frame whose bytes cross position 2^32 (the counter wrapping) decodes', () => {
    const rx = ring(64);
    const f: Frame = { type: MSG, flags: FLAG_EAGER, tag: -9, seq: 41, size: 1000 };
    for (let back = 1; back < FRAME_BYTES; back++) {
      const at = (2 ** 32 - back) >>> 0;
      rx.put(at, encodeFrame(f));
      const out: Frame = { type: CLOSE, flags: 0, tag: 0, seq: 0, size: 0 };
      expect(readFrame(rx, at, out)).toBeUndefined();
      expect(out).toEqual(f);
    }
  });

  it('fills the caller\'s frame in place and reads only its own 24 bytes', () => {
    const rx = ring(64);
    const out: Frame = { type: MSG, flags: 0, tag: 0, seq: 0, size: 0 };
    const a: Frame = { type: MSG, flags: 0, tag: 3, seq: 0, size: 10 };
    const b: Frame = { type: NACK, flags: 0, tag: 0, seq: 0, size: 7 };
    rx.put(60, encodeFrame(a)); // wraps
    rx.put(84, encodeFrame(b)); // right after it
    const before = rx.bytes.slice();
    expect(readFrame(rx, 60, out)).toBeUndefined();
    expect(out).toEqual(a);
    expect(readFrame(rx, 84, out)).toBeUndefined();
    expect(out).toEqual(b);
    expect(rx.bytes).toEqual(before); // nothing written
  });
});

describe('copyOut', () => {
  it('copies a payload at every offset of the ring, wrapping around its end, into a buffer at an offset', () => {
    const capacity = 64;
    const rx = ring(capacity);
    for (const len of [0, 1, 23, 40, capacity - 1, capacity]) {
      const payload = fill(new Uint8Array(len), len);
      for (let o = 0; o < capacity; o++) {
        for (const at of [o, (2 ** 32 - capacity + o) >>> 0]) {
          rx.put(at, payload);
          const dst = new Uint8Array(len + 20).fill(0xee);
          copyOut(rx, at, len, dst, 7);
          expect([...dst.subarray(7, 7 + len)], `${len} bytes at ${at}`).toEqual([...payload]);
          expect(dst.subarray(0, 7).every((x) => x === 0xee) && dst.subarray(7 + len).every((x) => x === 0xee)).toBe(true);
        }
      }
    }
  });
});
