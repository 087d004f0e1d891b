// The field descriptors of a @fields struct (shared by the C table and the TS layout).
import { structLayout } from '../layout';
import { AbiModel, lengthIn, StructDef, structNamed } from '../model';

/** One descriptor: member name, offset in the neutral struct, FieldKind name, element count. */
export interface FieldDesc {
  name: string;
  offset: number;
  kind: string;
  length: number;
}

/** Descriptors of every member of a struct's neutral form. */
export function fieldDescs(model: AbiModel, s: StructDef): FieldDesc[] {
  const layout = structLayout(model, s, null);
  return s.members.map((m, i) => {
    let kind = '';
    let length = lengthIn(m, null) ?? 1;
    if (m.type.kind === 'scalar') kind = m.type.field ?? '';
    if (m.type.kind === 'struct') {
      const inner = structNamed(model, m.type.name);
      kind = inner.field ?? '';
      length = Math.max(1, ...inner.members.map((x) => lengthIn(x, null) ?? 1));
    }
    return { name: m.name, offset: layout.members[i].offset, kind, length };
  });
}
