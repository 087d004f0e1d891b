// Emits native/generated/tsnet_tables.c: per-version adapters and the exported tables.
import { cParams, cType, sameCSignature, structCName } from '../c';
import { AdapterPlan, constMacro, copyFnName, planAdapter } from '../convert';
import { AbiModel, coreName, coreOf, lengthIn, membersIn, overloadFor, slotIn, snake, structNamed } from '../model';
import { render } from '../render';
import { banner, Emitter } from './emitter';
import { fieldDescs } from './fields';

/** Body lines of the function copying the neutral struct into version v's. */
function copyLines(model: AbiModel, name: string, v: number): string[] {
  const s = structNamed(model, name);
  const lines = ['memset(dst, 0, sizeof(*dst));'];
  for (const m of membersIn(s, v)) {
    const counted = s.members.find((a) => a.countedBy === m.name);
    const inner = m.type.kind === 'struct' ? structNamed(model, m.type.name) : null;
    if (counted) {
      const n = lengthIn(counted, v);
      lines.push(`dst->${m.name} = src->${m.name} < 0 ? 0 : src->${m.name} > ${n} ? ${n} : src->${m.name};`);
    } else if (m.lengths) {
      lines.push(`memcpy(dst->${m.name}, src->${m.name}, sizeof(dst->${m.name}));`);
    } else if (inner?.versioned) {
      lines.push(`${copyFnName(model, inner.name, v)}(&dst->${m.name}, &src->${m.name});`);
    } else {
      lines.push(`dst->${m.name} = src->${m.name};`);
    }
  }
  return lines;
}

/** Copy functions a version needs, the structs they hold first. */
function copies(model: AbiModel, needed: [string, number][]) {
  const out: { name: string; dst: string; src: string; lines: string[] }[] = [];
  const visit = (struct: string, v: number) => {
    const s = structNamed(model, struct);
    const name = copyFnName(model, struct, v);
    if (out.some((c) => c.name === name)) return;
    for (const m of membersIn(s, v)) {
      if (m.type.kind === 'struct' && structNamed(model, m.type.name).versioned) visit(m.type.name, v);
    }
    out.push({ name, dst: structCName(s, v), src: structCName(s, null), lines: copyLines(model, struct, v) });
  };
  for (const [struct, v] of needed) visit(struct, v);
  return out;
}

function versionView(model: AbiModel, v: number) {
  const adapters: { ret: string; name: string; params: string; lines: string[] }[] = [];
  const needed: [string, number][] = [];
  const slots = model.table.slots.filter((s) => slotIn(s, v)).map((s) => {
    if (s.data) return { name: s.name, value: `"${s.data.value}"` };
    if (s.unimplemented) return { name: s.name, value: 'NULL' };
    const o = overloadFor(s, v)!;
    const core = coreOf(s)!;
    if (sameCSignature(model, o, v, core)) return { name: s.name, value: coreName(s) };
    const plan = planAdapter(model, o, v, core) as AdapterPlan;
    const call = `${coreName(s)}(${plan.args.join(', ')})`;
    const ret = cType(model, o.ret, v);
    const lines = plan.after.length
      ? [...plan.prelude, `${ret} rc = ${call};`, ...plan.after, 'return rc;']
      : [...plan.prelude, `return ${call};`];
    const name = `tsn_v${v}_${snake(s.name)}`;
    adapters.push({ ret, name, params: cParams(model, o, v), lines });
    needed.push(...plan.copies);
    return { name: s.name, value: name };
  });
  const t = model.table;
  return {
    version: v,
    copies: copies(model, needed),
    adapters,
    table: { cname: `${t.cname}_v${v}_t`, symbol: `${t.exportName}_v${v}`, slots },
  };
}

function fieldTables(model: AbiModel) {
  return model.structs.filter((s) => s.fields).map((s) => {
    const group = model.constants.find((g) => g.name === 'FieldKind');
    return {
      name: `${s.cname}_fields`,
      count: `${s.cname}_field_count`,
      cname: structCName(s, null),
      fields: fieldDescs(model, s).map((f) => ({ ...f, kind: `${group?.prefix ?? ''}${f.kind}` })),
    };
  });
}

export const emitTables: Emitter = {
  output: 'native/generated/tsnet_tables.c',
  source: 'codegen/emit/emitTables.ts',
  emit(model) {
    return render('tsnet_tables.c.hbs', {
      banner: banner(this.source, 'c'),
      success: constMacro(model, 'SUCCESS') ?? 'TSN_SUCCESS',
      versions: model.versions.map((v) => versionView(model, v)),
      fieldTables: fieldTables(model),
    });
  },
};
