// Rendering model types as C.
import { AbiModel, CType, FnType, StructDef, structNamed } from './model';

/** C name of a struct in a version: tsn_props_v9_t, or tsn_props_t (neutral / unversioned). */
export function structCName(s: StructDef, version: number | null): string {
  return s.versioned && version !== null ? `${s.cname}_v${version}_t` : `${s.cname}_t`;
}

/** C spelling of a type within a version (null: the neutral core). */
export function cType(model: AbiModel, t: CType, version: number | null): string {
  switch (t.kind) {
    case 'void':
      return 'void';
    case 'scalar':
      return t.c;
    case 'typedef': {
      const td = model.typedefs.find((d) => d.alias === t.alias);
      return `${td?.cname ?? t.alias}_t`;
    }
    case 'struct':
      return structCName(structNamed(model, t.name), version);
    case 'ptr':
      return `${t.constTo ? 'const ' : ''}${cType(model, t.to, version)}*`;
  }
}

/** `type name` pairs of a function type, `void` when it has none. */
export function cParams(model: AbiModel, fn: FnType, version: number | null): string {
  const list = fn.params.map((p) => `${cType(model, p.type, version)} ${p.name}`);
  if (fn.variadic) list.push('...');
  return list.length ? list.join(', ') : 'void';
}

/** Whether a version's function has exactly the core's C types and parameter names. */
export function sameCSignature(model: AbiModel, a: FnType, av: number, b: FnType): boolean {
  return cType(model, a.ret, av) === cType(model, b.ret, null) && a.variadic === b.variadic &&
    cParams(model, a, av) === cParams(model, b, null);
}
