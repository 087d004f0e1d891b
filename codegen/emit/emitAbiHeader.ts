// Emits native/generated/tsnet_abi.h: typedefs, constants, structs, tables, core prototypes.
import { cParams, cType } from '../c';
import { tableLayout } from '../layout';
import { AbiModel, coreName, coreOf, lengthIn, overloadFor, slotIn } from '../model';
import { render } from '../render';
import { banner, Emitter } from './emitter';
import { structInstances, structView } from './structs';

/** A C integer literal for a constant (wide values get ULL, negatives parentheses). */
export function cNumber(v: number): string {
  if (v < 0) return `(${v})`;
  return v > 0x7fffffff ? `${v}ULL` : String(v);
}

function typedefs(model: AbiModel) {
  return model.typedefs.map((t) => ({
    doc: t.doc,
    decl: t.fn
      ? `typedef ${cType(model, t.fn.ret, null)} (*${t.cname}_t)(${cParams(model, t.fn, null)});`
      : `typedef ${t.scalar} ${t.cname}_t;`,
  }));
}

function arrayMacros(model: AbiModel) {
  return model.structs.filter((s) => s.versioned).flatMap((s) => s.members.filter((m) => m.lengths).map((m) => ({
    macro: `${s.cname.toUpperCase()}_MAX_${m.name.toUpperCase()}`,
    value: String(lengthIn(m, null)),
    doc: `Largest length of ${s.cname}.${m.name} over all versions.`,
  })));
}

function tables(model: AbiModel) {
  const t = model.table;
  return model.versions.map((v) => ({
    doc: `${t.doc} (v${v})`,
    tag: `${t.cname}_v${v}`,
    cname: `${t.cname}_v${v}_t`,
    size: tableLayout(model, v).size,
    slots: t.slots.filter((s) => slotIn(s, v)).map((s) => {
      const o = overloadFor(s, v);
      const decl = s.data
        ? `${cType(model, s.data.type, v)} ${s.name};`
        : `${cType(model, o!.ret, v)} (*${s.name})(${cParams(model, o!, v)});`;
      return { decl, doc: (o?.doc ?? s.doc) + (s.unimplemented ? ' NULL in tsnet.' : '') };
    }),
  }));
}

function cores(model: AbiModel) {
  return model.table.slots.filter((s) => !s.data && !s.unimplemented).map((s) => {
    const c = coreOf(s)!;
    return { doc: c.doc, proto: `${cType(model, c.ret, null)} ${coreName(s)}(${cParams(model, c, null)});` };
  });
}

function fieldTables(model: AbiModel) {
  return model.structs.filter((s) => s.fields).map((s) => ({ name: `${s.cname}_fields`, count: `${s.cname}_field_count`, cname: `${s.cname}_t` }));
}

export const emitAbiHeader: Emitter = {
  output: 'native/generated/tsnet_abi.h',
  source: 'codegen/emit/emitAbiHeader.ts',
  emit(model) {
    return render('tsnet_abi.h.hbs', {
      banner: banner(this.source, 'c'),
      versions: `v${model.versions[0]} to v${model.versions[model.versions.length - 1]}`,
      typedefs: typedefs(model),
      constants: model.constants.map((g) => ({
        doc: g.doc,
        members: g.members.map((m) => ({ macro: g.prefix + m.name, value: cNumber(m.value), doc: m.doc })),
      })),
      arrayMacros: arrayMacros(model),
      structs: structInstances(model).map((s) => structView(model, s)),
      tables: tables(model),
      fieldTables: fieldTables(model),
      cores: cores(model),
    });
  },
};
