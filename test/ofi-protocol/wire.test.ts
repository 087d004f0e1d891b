// Wire formats: immediate data fields, sequence unwrapping, handle and CONNECT/ACCEPT round trips
// and their refusals.
import { describe, expect, it } from 'vitest';
import { NetError } from '../../plugin/errors';
import {
  ACCEPT_BYTES,
  ACCEPT_MAGIC,
  CONNECT_BYTES,
  CONNECT_GPU_IPC,
  HANDLE_BYTES,
  MsgKind,
  PROTOCOL_VERSION,
  REFUSAL_BYTES,
  REFUSAL_WORDS,
  Refusal,
  SEGS_CTRL,
  closeMark,
  decodeAccept,
  decodeConnect,
  decodeHandle,
  encodeAccept,
  encodeConnect,
  encodeHandle,
  encodeRefusal,
  entryMark,
  immClose,
  immCloseMark,
  immComm,
  immIndex,
  immMsg,
  immSegs,
  immSeq,
  immWrite,
  msgId,
  msgKind,
  unwrapAfter,
  unwrapBefore,
} from '../../plugin/transports/ofi/wire';

const name = (b: number) => new Uint8Array(16).fill(b);

describe('immediate data', () => {
  it('packs sequence, comm, sub-receive and segments into 32 bits', () => {
    const imm = immWrite(32767, 1023, 7, 14);
    expect(imm).toBe(0xffffffff - 0x10000000);
    expect([immSeq(imm), immComm(imm), immIndex(imm), immSegs(imm)]).toEqual([1023, 32767, 7, 14]);
    const c = immWrite(5, 1024 + 3, 2, SEGS_CTRL);
    expect([immSeq(c), immComm(c), immIndex(c), immSegs(c)]).toEqual([3, 5, 2, 0]);
    expect(c).toBeGreaterThanOrEqual(0);
  });

  it('two-sided messages carry kind and id', () => {
    const m = immMsg(MsgKind.HEARTBEAT, 12345);
    expect([msgKind(m), msgId(m)]).toEqual([MsgKind.HEARTBEAT, 12345]);
  });

  it('sequence numbers unwrap around the expected value', () => {
    expect(unwrapAfter(1020, 2, 10)).toBe(1026);
    expect(unwrapAfter(5, 5, 10)).toBe(5);
    expect(unwrapBefore(1030, 1020, 10)).toBe(1020);
    expect(unwrapBefore(1030, 6, 10)).toBe(1030);
    expect(unwrapBefore(70000, 0xffff, 16)).toBe(65535);
    expect(entryMark(65536 + 3, 8, 7)).toBe(3 | (8 << 16) | (7 << 24));
  });
});

describe('handle', () => {
  it('round-trips in 80 bytes', () => {
    const b = encodeHandle({ listener: 77, nonce: 0xdeadbeef, nics: 2, name: name(9) });
    expect(b.length).toBe(HANDLE_BYTES);
    expect(HANDLE_BYTES).toBeLessThanOrEqual(128);
    const padded = new Uint8Array(128);
    padded.set(b);
    expect(decodeHandle(padded)).toEqual({ listener: 77, nonce: 0xdeadbeef, nics: 2, name: name(9) });
  });

  it('refuses another transport, version or a bad name', () => {
    const b = encodeHandle({ listener: 1, nonce: 1, nics: 1, name: name(1) });
    const bad = (f: (x: Uint8Array) => void, msg: RegExp) => {
      const x = b.slice();
      f(x);
      expect(() => decodeHandle(x)).toThrow(msg);
      try {
        decodeHandle(x);
      } catch (e) {
        expect((e as NetError).code).toBe(4);
      }
    };
    bad((x) => (x[0] = 0), /not a tsnet libfabric handle/);
    bad((x) => (x[4] = 9), /protocol version 9/);
    bad((x) => (x[6] = 65), /name length/);
    bad((x) => (x[8] = x[9] = 0), /listener 0/);
    expect(() => decodeHandle(b.slice(0, 8))).toThrow(/fewer than its header/);
  });
});

describe('CONNECT and ACCEPT', () => {
  it('round-trip with up to 4 rails', () => {
    const out = new Uint8Array(512);
    const c = {
      listenerNonce: 1,
      connectorNonce: 2,
      comm: 300,
      rails: 4,
      eagerMax: -1,
      flags: CONNECT_GPU_IPC,
      pid: 0xfffe_0001,
      start: 2 ** 40 + 12345,
      boot: new Uint8Array(16).map((_, i) => 0xf0 + i),
      mailboxAddr: 0x7fff_1234_5000,
      mailboxKeys: [0, 1, 2, 3].map((i) => ({ lo: 0xffff0000 + i, hi: i })),
      names: [1, 2, 3, 4].map(name),
    };
    const n = encodeConnect(c, out);
    expect(n).toBeLessThanOrEqual(CONNECT_BYTES);
    expect(decodeConnect(out.subarray(0, n))).toEqual(c);
    // The start time at its documented offsets (docs/rdma-protocol.md), little-endian u64.
    const v = new DataView(out.buffer);
    expect([v.getUint32(72, true), v.getUint32(76, true)]).toEqual([12345, 256]);
    expect([...out.subarray(80, 96)]).toEqual([...c.boot]);
    expect(n).toBe(96 + 4 * 64);
    const a = { connectorNonce: 2, comm: 9, rails: 2, eagerCapacity: 8192, pid: 4242, start: 0xffff_ffff + 7, boot: new Uint8Array(16).fill(9), names: [5, 6].map(name) };
    const m = encodeAccept(a, out);
    expect(m).toBeLessThanOrEqual(ACCEPT_BYTES);
    expect(m).toBe(56 + 2 * 64);
    expect([v.getUint32(32, true), v.getUint32(36, true)]).toEqual([6, 1]);
    expect([...out.subarray(40, 56)]).toEqual(new Array(16).fill(9));
    expect(decodeAccept(out.subarray(0, m))).toEqual(a);
  });

  it('says what is wrong with a bad message', () => {
    expect(decodeConnect(new Uint8Array(10))).toMatch(/10 bytes/);
    expect(decodeConnect(new Uint8Array(64))).toMatch(/64 bytes/);
    expect(decodeConnect(new Uint8Array(88))).toMatch(/88 bytes/);
    expect(decodeConnect(new Uint8Array(96))).toMatch(/bad magic/);
    expect(decodeAccept(new Uint8Array(64))).toMatch(/bad magic/);
    const out = new Uint8Array(512);
    const m = encodeAccept({ connectorNonce: 2, comm: 9, rails: 1, eagerCapacity: 0, pid: 1, start: 0, boot: new Uint8Array(16), names: [name(1)] }, out);
    expect(decodeAccept(out.subarray(0, m - 1))).toMatch(/names of 16 bytes/);
    out[20] = 1;
    expect(decodeAccept(out.subarray(0, m))).toEqual({ connectorNonce: 2, refused: 1 });
  });

  it('a refusal is an ACCEPT header with the connector nonce and a status, and no names', () => {
    const out = new Uint8Array(128).fill(0xee);
    const n = encodeRefusal(0xdead_beef, Refusal.STALE_HANDLE, out);
    expect(n).toBe(REFUSAL_BYTES);
    expect(n).toBe(56);
    expect(decodeAccept(out.subarray(0, n))).toEqual({ connectorNonce: 0xdead_beef, refused: 2 });
    const v = new DataView(out.buffer);
    expect([v.getUint32(0, true), v.getUint16(4, true), v.getUint32(20, true)]).toEqual([ACCEPT_MAGIC, PROTOCOL_VERSION, 2]);
    expect(out[n]).toBe(0xee); // nothing written past it
    expect(REFUSAL_WORDS[Refusal.LISTENER_CLOSED]).toMatch(/listener is closed/);
  });

  it('a CLOSE names the comm and carries 14 bits of the connector nonce above the kind', () => {
    const imm = immClose(32767, 0xffff_c123);
    expect(msgKind(imm)).toBe(MsgKind.CLOSE);
    expect(msgId(imm)).toBe(32767);
    expect(immCloseMark(imm)).toBe(closeMark(0xffff_c123));
    expect(closeMark(0xffff_c123)).toBe(0x0123);
    expect(imm).toBeLessThan(2 ** 32);
    expect(immCloseMark(immMsg(MsgKind.HEARTBEAT, 5))).toBe(0);
  });
});
