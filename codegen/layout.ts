// Struct layout on x86_64 (LP64): what the C compiler does, so TS and docs know it.
import { AbiModel, CType, lengthIn, membersIn, slotIn, StructDef, structNamed } from './model';

/** Size and alignment of the C scalar types the definitions use. */
const SCALARS: Record<string, number> = {
  int16_t: 2, int: 4, uint32_t: 4, float: 4,
  int64_t: 8, uint64_t: 8, size_t: 8, 'unsigned long': 8, 'char*': 8, 'const char*': 8,
};

/** Layout of one member. */
export interface MemberLayout {
  name: string;
  offset: number;
  size: number;
}

/** Layout of a struct. */
export interface StructLayout {
  size: number;
  align: number;
  members: MemberLayout[];
}

function align(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}

/** Size and alignment of a type within a version (null: the neutral struct). */
export function sizeOf(model: AbiModel, t: CType, version: number | null): { size: number; align: number } {
  switch (t.kind) {
    case 'ptr':
      return { size: 8, align: 8 };
    case 'scalar': {
      const n = SCALARS[t.c];
      if (n === undefined) throw new Error(`layout: unknown C scalar '${t.c}'`);
      return { size: n, align: n };
    }
    case 'typedef': {
      const td = model.typedefs.find((d) => d.alias === t.alias);
      return td?.scalar ? { size: SCALARS[td.scalar], align: SCALARS[td.scalar] } : { size: 8, align: 8 };
    }
    case 'struct': {
      const l = structLayout(model, structNamed(model, t.name), version);
      return { size: l.size, align: l.align };
    }
    case 'void':
      throw new Error('layout: void has no size');
  }
}

/** Whether a C scalar name is known to the layout rules. */
export function knownScalar(c: string): boolean {
  return c in SCALARS;
}

/** Layout of a struct in a version (null: neutral, every member at its largest). */
export function structLayout(model: AbiModel, s: StructDef, version: number | null): StructLayout {
  const v = s.versioned ? version : null;
  let offset = 0;
  let maxAlign = 1;
  const members: MemberLayout[] = [];
  for (const m of membersIn(s, v)) {
    const el = sizeOf(model, m.type, v);
    const size = el.size * (lengthIn(m, v) ?? 1);
    offset = align(offset, el.align);
    members.push({ name: m.name, offset, size });
    offset += size;
    maxAlign = Math.max(maxAlign, el.align);
  }
  return { size: align(offset, maxAlign), align: maxAlign, members };
}

/** Layout of the function table of a version: one pointer per present slot. */
export function tableLayout(model: AbiModel, version: number): StructLayout {
  const slots = model.table.slots.filter((s) => slotIn(s, version));
  return { size: slots.length * 8, align: 8, members: slots.map((s, i) => ({ name: s.name, offset: i * 8, size: 8 })) };
}
