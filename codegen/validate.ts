// Checks the model before anything is emitted; every problem is a `file:line: message`.
import { sameCSignature } from './c';
import { planAdapter } from './convert';
import { Reporter } from './diagnostics';
import { knownScalar } from './layout';
import { AbiModel, CType, MemberDef, SlotDef, StructDef } from './model';

function checkSlot(model: AbiModel, slot: SlotDef, rep: Reporter): void {
  for (const v of model.versions) {
    const covering = slot.overloads.filter((o) => o.versions.includes(v)).length +
      slot.absent.filter((a) => a === v).length + (slot.data?.versions.includes(v) ? 1 : 0);
    if (covering === 0) rep.error(slot.loc, `slot '${slot.name}': v${v} has neither a signature nor @absent`);
    if (covering > 1) rep.error(slot.loc, `slot '${slot.name}': v${v} is declared ${covering} times`);
  }
  if (slot.data) return;
  const cores = slot.overloads.filter((o) => o.core);
  if (slot.unimplemented) {
    for (const c of cores) rep.error(c.loc, `slot '${slot.name}' is @unimplemented but has a @core overload`);
    return;
  }
  if (cores.length !== 1) {
    rep.error(slot.loc, `slot '${slot.name}' is implemented and needs exactly one @core overload, found ${cores.length}`);
    return;
  }
  const core = cores[0];
  for (const c of core.counts) {
    if (!core.params.some((p) => p.name === c.param) || !core.params.some((p) => p.name === c.by)) {
      rep.error(core.loc, `@count ${c.param} ${c.by}: no such parameters`);
    }
  }
  for (const f of core.fills) {
    if (!core.params.some((p) => p.name === f.param)) rep.error(core.loc, `@fill ${f.param}: no such parameter`);
  }
  for (const o of slot.overloads) {
    if (o !== core && o.fills.length) rep.error(o.loc, `@fill belongs on the @core overload of '${slot.name}'`);
  }
  for (const v of model.versions) {
    const o = slot.overloads.find((x) => x.versions.includes(v));
    if (!o || sameCSignature(model, o, v, core)) continue;
    const plan = planAdapter(model, o, v, core);
    if ('errors' in plan) for (const e of plan.errors) rep.error(e.loc, `slot '${slot.name}': ${e.message}`);
  }
}

function checkType(model: AbiModel, t: CType, m: { loc: MemberDef['loc'] }, rep: Reporter): void {
  if (t.kind === 'scalar' && !knownScalar(t.c)) rep.error(m.loc, `C type '${t.c}' has no known layout`);
  if (t.kind === 'ptr') checkType(model, t.to, m, rep);
}

function checkStruct(model: AbiModel, s: StructDef, rep: Reporter): void {
  const kinds = model.constants.find((g) => g.name === 'FieldKind')?.members.map((m) => m.name) ?? [];
  for (const m of s.members) {
    checkType(model, m.type, m, rep);
    if (m.type.kind === 'void') rep.error(m.loc, `member '${m.name}' cannot be void`);
    if (m.lengths) {
      for (const v of m.versions) if (!m.lengths.has(v)) rep.error(m.loc, `array '${m.name}' has no @length for v${v}`);
    }
    if (m.countedBy && !s.members.some((c) => c.name === m.countedBy && c.type.kind === 'scalar')) {
      rep.error(m.loc, `@countedBy '${m.countedBy}' is not a scalar member of ${s.name}`);
    }
    const t = m.type;
    const inner = t.kind === 'struct' ? model.structs.find((x) => x.name === t.name) ?? null : null;
    if (inner) {
      const missing = m.versions.filter((v) => !inner.versions.includes(v));
      if (missing.length) rep.error(m.loc, `member '${m.name}' exists in v${missing.join(', v')} where ${inner.name} does not`);
      if (inner.versioned && !s.versioned) rep.error(m.loc, `${s.name} holds versioned ${inner.name}: give it per-version members`);
    }
    if (s.fields) {
      const kind = t.kind === 'scalar' ? t.field : inner?.field ?? null;
      if (kind === null || !kinds.includes(kind)) {
        rep.error(m.loc, `member '${m.name}' of @fields struct ${s.name} needs a @field kind that FieldKind defines`);
      }
    }
  }
}

/** Validates the model; throws AbiError listing every problem. */
export function validate(model: AbiModel): void {
  const rep = new Reporter();
  for (const slot of model.table.slots) checkSlot(model, slot, rep);
  for (const s of model.structs) checkStruct(model, s, rep);
  const macros = new Map<string, string>();
  for (const g of model.constants) {
    for (const m of g.members) {
      const name = g.prefix + m.name;
      if (macros.has(name)) rep.error(m.loc, `constant ${name} is also defined by ${macros.get(name)}`);
      macros.set(name, `${g.name}.${m.name}`);
    }
  }
  rep.throwIfAny();
}
