// Shared by the emitters: structs in dependency order and their C views.
import { cType, structCName } from '../c';
import { structLayout } from '../layout';
import { AbiModel, lengthIn, membersIn, StructDef, structNamed } from '../model';

/** Structs ordered so that every struct comes after the structs it holds. */
export function structOrder(model: AbiModel): StructDef[] {
  const out: StructDef[] = [];
  const visit = (s: StructDef) => {
    if (out.includes(s)) return;
    for (const m of s.members) if (m.type.kind === 'struct') visit(structNamed(model, m.type.name));
    out.push(s);
  };
  model.structs.forEach(visit);
  return out;
}

/** One emitted C struct: a version of a struct, or its neutral / only form. */
export interface StructInstance {
  def: StructDef;
  version: number | null;
  cname: string;
}

/** Every C struct to emit: per version for versioned structs, then the neutral one. */
export function structInstances(model: AbiModel): StructInstance[] {
  return structOrder(model).flatMap((def) => {
    const versions: (number | null)[] = def.versioned ? [...def.versions, null] : [null];
    return versions.map((version) => ({ def, version, cname: structCName(def, version) }));
  });
}

/** C member declarations and layout asserts of a struct instance. */
export function structView(model: AbiModel, s: StructInstance) {
  const layout = structLayout(model, s.def, s.version);
  const members = membersIn(s.def, s.def.versioned ? s.version : null).map((m) => {
    const len = lengthIn(m, s.def.versioned ? s.version : null);
    return { decl: `${cType(model, m.type, s.version)} ${m.name}${len === null ? '' : `[${len}]`};`, doc: m.doc };
  });
  return {
    doc: s.def.doc + (s.version === null ? (s.def.versioned ? ' Version-neutral: every member of every version.' : '') : ` Layout of v${s.version}.`),
    tag: s.cname.replace(/_t$/, ''),
    cname: s.cname,
    members,
    size: layout.size,
    offsets: layout.members.map((m) => ({ name: m.name, offset: m.offset })),
  };
}
