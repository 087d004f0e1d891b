// The records shared between the protocol threads and the native engine: the C compiler's
// layout of native/engine/records.h (test/engine/records.c prints it) against every number in
// plugin/engine/records.ts, and the widths the TypeScript accessors (port.ts, native-link.ts)
// read and write each field with.
import * as fs from 'fs';
import * as path from 'path';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  CQE, CQE_NO_SRC, CQE_REMOTE, CQE_RX, CqeFlag, POST, RING, RX, SLOT, STATUS_EOF, STATUS_OK, SUB, SUB_F_IMM, SUB_F_NOCQE, SlotState, SubKind,
} from '../../plugin/engine/records';
import { ROOT, compileRun } from '../layout/cc';

type Fields = Record<string, [offset: number, size: number]>;
interface Layout {
  structs: Record<string, { size: number; fields: Fields }>;
  consts: Record<string, number>;
}

const HEADER = path.join(ROOT, 'native/engine/records.h');
let c: Layout;

beforeAll(() => {
  const r = compileRun('records', ['test/engine/records.c'], ['-I', path.join(ROOT, 'native/engine')]);
  expect(r.status, r.stderr).toBe(0);
  c = JSON.parse(r.stdout) as Layout;
});

/** What records.h declares, read from its text: struct members and TSN_ constants. */
function declared(): { structs: Record<string, string[]>; consts: string[] } {
  const text = fs.readFileSync(HEADER, 'utf8').replace(/\/\/.*$/gm, '');
  const structs: Record<string, string[]> = {};
  for (const m of text.matchAll(/typedef struct \w+ \{([^}]*)\} (\w+);/g))
    structs[m[2]] = [...m[1].matchAll(/\b(\w+)(?:\[[^\]]*\])?;/g)].map((f) => f[1]);
  const consts = [
    ...[...text.matchAll(/enum \{([^}]*)\}/g)].flatMap((m) => [...m[1].matchAll(/\b(TSN_\w+)\s*=/g)].map((x) => x[1])),
    ...[...text.matchAll(/#define (TSN_\w+) /g)].map((m) => m[1]).filter((n) => n !== 'TSN_REC_ASSERT'),
  ];
  return { structs, consts };
}

/** The members of a const enum of records.ts, read from its text (a const enum has no object to list). */
function enumMembers(name: string): string[] {
  const text = fs.readFileSync(path.join(ROOT, 'plugin/engine/records.ts'), 'utf8');
  const body = new RegExp(`export const enum ${name} \\{([^}]*)\\}`).exec(text)?.[1] ?? '';
  return [...body.matchAll(/(\w+)\s*=/g)].map((m) => m[1]).sort();
}

/** Offsets of the named (non-padding) fields of a C struct. */
function offsets(name: string): Record<string, number> {
  return Object.fromEntries(Object.entries(c.structs[name].fields).filter(([f]) => !f.startsWith('pad')).map(([f, [off]]) => [f, off]));
}

/** The TypeScript record minus its non-offset entries. */
function tsOffsets(rec: Record<string, number>, skip: string[] = []): Record<string, number> {
  return Object.fromEntries(Object.entries(rec).filter(([k]) => k !== 'bytes' && !skip.includes(k)));
}

describe('records.c covers records.h', () => {
  it('every struct and member of the header is printed', () => {
    const d = declared();
    expect(Object.keys(c.structs).sort()).toEqual(Object.keys(d.structs).sort());
    for (const [name, fields] of Object.entries(d.structs)) expect(Object.keys(c.structs[name].fields), name).toEqual(fields);
  });
  it('every TSN_ constant of the header is printed', () => {
    expect(Object.keys(c.consts).sort()).toEqual(declared().consts.sort());
  });
});

describe('records.ts against the C layout', () => {
  it('RING: ring header size and offsets', () => {
    expect(RING.bytes).toBe(c.structs.tsn_ring_hdr_t.size);
    expect(tsOffsets(RING)).toEqual(offsets('tsn_ring_hdr_t'));
  });

  it('SUB: submission record size, offsets and the inline capacity', () => {
    expect(SUB.bytes).toBe(c.structs.tsn_sub_t.size);
    expect(tsOffsets(SUB, ['inlineMax'])).toEqual(offsets('tsn_sub_t'));
    expect(SUB.inlineMax).toBe(c.consts.TSN_SUB_INLINE);
    expect(c.structs.tsn_sub_t.fields.inl[1]).toBe(SUB.inlineMax);
  });

  it('CQE: completion record size and offsets', () => {
    expect(CQE.bytes).toBe(c.structs.tsn_cqe_t.size);
    expect(tsOffsets(CQE)).toEqual(offsets('tsn_cqe_t'));
  });

  it('RX: receive ring header size and offsets', () => {
    expect(RX.bytes).toBe(c.structs.tsn_rx_hdr_t.size);
    expect(tsOffsets(RX)).toEqual(offsets('tsn_rx_hdr_t'));
  });

  it('SLOT: slot status in int32s (state, result, 8 sizes)', () => {
    const s = c.structs.tsn_slot_status_t;
    expect(SLOT.ints * 4).toBe(s.size);
    expect({ state: SLOT.state * 4, result: SLOT.result * 4, sizes: SLOT.sizes * 4 }).toEqual(offsets('tsn_slot_status_t'));
    expect(s.fields.sizes[1]).toBe((SLOT.ints - SLOT.sizes) * 4);
  });

  it('SubKind and SUB_F_NOCQE: every submission kind of the header, same values', () => {
    const kinds = Object.fromEntries(
      Object.entries(c.consts)
        .filter(([n]) => n.startsWith('TSN_SUB_') && !n.startsWith('TSN_SUB_F_') && n !== 'TSN_SUB_INLINE')
        .map(([n, v]) => [n.slice('TSN_SUB_'.length), v]),
    );
    expect(enumMembers('SubKind')).toEqual(Object.keys(kinds).sort());
    expect({
      WRITE: SubKind.WRITE, READ: SubKind.READ, DISCARD: SubKind.DISCARD, RX_RESUME: SubKind.RX_RESUME,
      OFI_RECV: SubKind.OFI_RECV, OFI_SEND: SubKind.OFI_SEND, OFI_WRITE: SubKind.OFI_WRITE, OFI_READ: SubKind.OFI_READ,
    }).toEqual(kinds);
    expect(SUB_F_NOCQE).toBe(c.consts.TSN_SUB_F_NOCQE);
    expect(SUB_F_IMM).toBe(c.consts.TSN_SUB_F_IMM);
  });

  it('completion constants: CQE_RX, CQE_REMOTE, CQE_NO_SRC, STATUS_OK, STATUS_EOF, the CqeFlag bits', () => {
    expect(CQE_RX).toBe(c.consts.TSN_CQE_RX);
    expect(CQE_REMOTE).toBe(c.consts.TSN_CQE_REMOTE);
    expect(CQE_NO_SRC).toBe(c.consts.TSN_CQE_NO_SRC);
    const flags = Object.fromEntries(Object.entries(c.consts).filter(([n]) => n.startsWith('TSN_CQE_F_')).map(([n, v]) => [n.slice('TSN_CQE_F_'.length), v]));
    expect(enumMembers('CqeFlag')).toEqual(Object.keys(flags).sort());
    expect({
      SEND: CqeFlag.SEND, RECV: CqeFlag.RECV, WRITE: CqeFlag.WRITE, READ: CqeFlag.READ, REMOTE_WRITE: CqeFlag.REMOTE_WRITE, DATA: CqeFlag.DATA,
    }).toEqual(flags);
    expect(STATUS_OK).toBe(c.consts.TSN_STATUS_OK);
    expect(STATUS_EOF).toBe(c.consts.TSN_STATUS_EOF);
  });

  it('SlotState: every TSN_SLOT_ state, same values', () => {
    const states = Object.fromEntries(Object.entries(c.consts).filter(([n]) => n.startsWith('TSN_SLOT_')).map(([n, v]) => [n.slice('TSN_SLOT_'.length), v]));
    expect(enumMembers('SlotState')).toEqual(Object.keys(states).sort());
    expect({ FREE: SlotState.FREE, POSTED: SlotState.POSTED, DONE: SlotState.DONE, FAILED: SlotState.FAILED }).toEqual(states);
  });

  it('POST: mailbox record head and per-buffer doubles', () => {
    expect(POST).toEqual({ head: c.consts.TSN_POST_HEAD, buf: c.consts.TSN_POST_BUF });
  });
});

describe('field widths the TypeScript accessors use', () => {
  // port.ts writes submissions as u32 lane/link/op/flags, u16 kind/inlineLen, f64 addr/len and
  // reads completions as u32 link/op, i32 status, f64 value/time; native-link.ts reads the
  // receive ring header as u32s; plugin.ts writes slot states as int32s.
  const widths: Record<string, Record<string, number>> = {
    tsn_ring_hdr_t: { head: 4, tail: 4, mask: 4, recordBytes: 4 },
    tsn_sub_t: { lane: 4, link: 4, op: 4, kind: 2, inlineLen: 2, addr: 8, len: 8, raddr: 8, rkeyLo: 4, rkeyHi: 4, imm: 4, flags: 4, aux: 4, mr: 4, inl: SUB.inlineMax },
    tsn_cqe_t: { link: 4, op: 4, status: 4, imm: 4, value: 8, flags: 4, immHi: 4, time: 8, src: 4 },
    tsn_rx_hdr_t: { written: 4, consumed: 4, stalled: 4, capacity: 4 },
    tsn_slot_status_t: { state: 4, result: 4, sizes: 32 },
  };
  for (const [name, want] of Object.entries(widths))
    it(name, () => {
      const got = Object.fromEntries(Object.entries(c.structs[name].fields).filter(([f]) => !f.startsWith('pad')).map(([f, [, size]]) => [f, size]));
      expect(got).toEqual(want);
    });

  it('every field sits on its own alignment, as typed-array views need', () => {
    for (const [name, s] of Object.entries(c.structs))
      for (const [f, [off, size]] of Object.entries(s.fields)) {
        const align = Math.min(size, 8);
        if (f !== 'inl' && !f.startsWith('pad') && f !== 'sizes') expect(off % align, `${name}.${f}`).toBe(0);
      }
  });

  it('the ring headers keep head, tail and the rest on separate 64-byte cache lines', () => {
    for (const name of ['tsn_ring_hdr_t', 'tsn_rx_hdr_t']) {
      const offs = Object.values(offsets(name));
      const lines = new Set(offs.map((o) => Math.floor(o / 64)));
      expect(lines.size, name).toBe(3);
      expect(c.structs[name].size % 64).toBe(0);
    }
  });
});
