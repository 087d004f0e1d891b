// The TCP transport's bytes outside the protocol: the 128-byte handle NCCL carries from the
// listener to the connector, and the HELLO each new socket starts with.
//
// handle: u32 magic 'TSNT', u16 version, u8 rails, u8 zero, 8-byte nonce, then per rail
//         u8 family (4|6), u8 zero, u16 port, 16-byte address
// HELLO:  u32 magic 'TSNH', u16 version, u8 role, u8 lane, 8-byte nonce, 8-byte connection id,
//         u32 data lanes, u32 eagerMax, u32 minStripe, u32 status (ACK only),
//         u8 eager policy, u8 stripe policy, u8 lane policy, u8 zero, u32 zero (policy ids:
//         plugin/protocol/policies/)
import * as net from 'node:net';
import { invalidArgument } from '../../errors';
import { LIMITS } from '../../protocol/link';

export const PROTOCOL_VERSION = 2;
export const HANDLE_MAGIC = 0x544e5354;
export const HELLO_MAGIC = 0x484e5354;
export const HELLO_BYTES = 48;
export const MAX_RAILS = 5;

export interface RailAddr {
  family: 4 | 6;
  address: string;
  port: number;
}

export interface Handle {
  nonce: Buffer;
  rails: RailAddr[];
}

export function encodeHandle(h: Handle): Uint8Array {
  const b = Buffer.alloc(16 + 20 * h.rails.length);
  b.writeUInt32LE(HANDLE_MAGIC, 0);
  b.writeUInt16LE(PROTOCOL_VERSION, 4);
  b.writeUInt8(h.rails.length, 6);
  h.nonce.copy(b, 8, 0, 8);
  h.rails.forEach((r, i) => {
    const at = 16 + 20 * i;
    b.writeUInt8(r.family, at);
    b.writeUInt16LE(r.port, at + 2);
    addrBytes(r).copy(b, at + 4);
  });
  return new Uint8Array(b.buffer, b.byteOffset, b.length);
}

export function decodeHandle(bytes: Uint8Array): Handle {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  if (b.length < 16) throw invalidArgument(`the handle has ${b.length} bytes, fewer than its header`);
  const magic = b.readUInt32LE(0);
  if (magic !== HANDLE_MAGIC)
    throw invalidArgument(`the handle is not a tsnet TCP handle (magic 0x${magic.toString(16)})`);
  const version = b.readUInt16LE(4);
  if (version !== PROTOCOL_VERSION)
    throw invalidArgument(`the handle speaks protocol ${version}, this tsnet speaks ${PROTOCOL_VERSION}`);
  const n = b.readUInt8(6);
  if (n < 1 || n > MAX_RAILS) throw invalidArgument(`the handle names ${n} rails`);
  if (b.length < 16 + 20 * n) throw invalidArgument(`the handle has ${b.length} bytes, too few for its ${n} rail(s)`);
  const rails: RailAddr[] = [];
  for (let i = 0; i < n; i++) {
    const at = 16 + 20 * i;
    const family = b.readUInt8(at);
    if (family !== 4 && family !== 6) throw invalidArgument(`rail ${i} of the handle has address family ${family}`);
    const raw = b.subarray(at + 4, at + 20);
    const address = family === 4 ? [...raw.subarray(0, 4)].join('.') : ipv6(raw);
    rails.push({ family, address, port: b.readUInt16LE(at + 2) });
  }
  return { nonce: Buffer.from(b.subarray(8, 16)), rails };
}

function addrBytes(r: RailAddr): Buffer {
  const out = Buffer.alloc(16);
  if (r.family === 4) {
    if (!net.isIPv4(r.address)) throw invalidArgument(`${r.address} is not an IPv4 address`);
    r.address.split('.').forEach((x, i) => out.writeUInt8(Number(x), i));
  } else {
    if (!net.isIPv6(r.address)) throw invalidArgument(`${r.address} is not an IPv6 address`);
    expand6(r.address).forEach((g, i) => out.writeUInt16BE(g, 2 * i));
  }
  return out;
}

// The eight 16-bit groups of an IPv6 address, with :: expanded and a dotted IPv4 tail
// (::ffff:1.2.3.4) turned into its two groups.
function expand6(a: string): number[] {
  const groups = (part: string) => {
    if (!part) return [];
    return part.split(':').flatMap((g) => {
      if (!g.includes('.')) return [parseInt(g, 16)];
      const [w, x, y, z] = g.split('.').map(Number);
      return [(w << 8) | x, (y << 8) | z];
    });
  };
  const [head, tail] = a.split('::');
  const h = groups(head);
  const t = tail === undefined ? [] : groups(tail);
  return [...h, ...Array(8 - h.length - t.length).fill(0), ...t];
}

function ipv6(raw: Buffer): string {
  const parts: string[] = [];
  for (let i = 0; i < 8; i++) parts.push(raw.readUInt16BE(2 * i).toString(16));
  const s = parts.join(':');
  return net.isIPv6(s) ? s : '::';
}

export const enum Role {
  CONTROL = 1,
  DATA = 2,
  ACK = 3,
}

export interface Hello {
  role: Role;
  lane: number;
  nonce: Buffer;
  connId: Buffer;
  lanes: number;
  eagerMax: number;
  minStripe: number;
  status: number;
  /** The sender's policy ids: eager, stripes, lanes. */
  policies: [number, number, number];
}

export function encodeHello(h: Hello): Buffer {
  const b = Buffer.alloc(HELLO_BYTES);
  b.writeUInt32LE(HELLO_MAGIC, 0);
  b.writeUInt16LE(PROTOCOL_VERSION, 4);
  b.writeUInt8(h.role, 6);
  b.writeUInt8(h.lane, 7);
  h.nonce.copy(b, 8, 0, 8);
  h.connId.copy(b, 16, 0, 8);
  b.writeUInt32LE(h.lanes, 24);
  b.writeUInt32LE(h.eagerMax, 28);
  b.writeUInt32LE(h.minStripe, 32);
  b.writeUInt32LE(h.status, 36);
  h.policies.forEach((id, i) => b.writeUInt8(id, 40 + i));
  return b;
}

/** The HELLO in b, or what is wrong with it. */
export function decodeHello(b: Buffer): Hello | string {
  if (b.length !== HELLO_BYTES) return `a greeting of ${b.length} bytes`;
  const magic = b.readUInt32LE(0);
  if (magic !== HELLO_MAGIC) return `bad magic 0x${magic.toString(16)}`;
  const version = b.readUInt16LE(4);
  if (version !== PROTOCOL_VERSION) return `protocol version ${version}, expected ${PROTOCOL_VERSION}`;
  const role = b.readUInt8(6);
  if (role < Role.CONTROL || role > Role.ACK) return `unknown role ${role}`;
  const h: Hello = {
    role,
    lane: b.readUInt8(7),
    nonce: Buffer.from(b.subarray(8, 16)),
    connId: Buffer.from(b.subarray(16, 24)),
    lanes: b.readUInt32LE(24),
    eagerMax: b.readUInt32LE(28),
    minStripe: b.readUInt32LE(32),
    status: b.readUInt32LE(36),
    policies: [b.readUInt8(40), b.readUInt8(41), b.readUInt8(42)],
  };
  // The receiver sizes its receive ring by eagerMax and its sockets by lanes: a value no tsnet
  // sends is refused here, before anything is allocated for it.
  if (h.lanes < 1 || h.lanes > LIMITS.lanes) return `${h.lanes} data lanes (1 to ${LIMITS.lanes})`;
  if (h.eagerMax > LIMITS.eagerMax) return `an eager limit of ${h.eagerMax} bytes (at most ${LIMITS.eagerMax})`;
  if (h.minStripe < LIMITS.minStripe || h.minStripe > LIMITS.maxStripe || h.minStripe % LIMITS.minStripe)
    return `a minimum stripe of ${h.minStripe} bytes (a multiple of ${LIMITS.minStripe} up to ${LIMITS.maxStripe})`;
  return h;
}
