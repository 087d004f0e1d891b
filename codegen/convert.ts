// How an adapter maps one version's arguments onto the core call, by parameter name.
import { cType } from './c';
import { AbiModel, CType, Loc, Overload, structNamed } from './model';

/** The body of an adapter: lines before the call, the call's arguments, lines after it. */
export interface AdapterPlan {
  prelude: string[];
  args: string[];
  after: string[];
  /** Versioned structs copied back from the neutral one: [struct name, version]. */
  copies: [string, number][];
}

/** The C macro of a constant member (e.g. MAX_RECVS → TSN_MAX_RECVS), or null. */
export function constMacro(model: AbiModel, member: string): string | null {
  const g = model.constants.find((c) => c.members.some((m) => m.name === member));
  return g ? g.prefix + member : null;
}

/** Name of the generated function copying the neutral struct into a version's. */
export function copyFnName(model: AbiModel, struct: string, version: number): string {
  return `${structNamed(model, struct).cname}_copy_v${version}`;
}

function defaultArg(model: AbiModel, t: CType): string {
  if (t.kind === 'ptr') return 'NULL';
  if (t.kind === 'typedef') return model.typedefs.find((d) => d.alias === t.alias)?.fn ? 'NULL' : '0';
  return '0';
}

function isScalar(t: CType, c: string): boolean {
  return t.kind === 'scalar' && t.c === c;
}

/**
 * Plans the adapter from overload `o` of `version` to the `core` overload.
 * Returns the problems instead when a parameter cannot be mapped.
 */
export function planAdapter(model: AbiModel, o: Overload, version: number, core: Overload): AdapterPlan | { errors: { loc: Loc; message: string }[] } {
  const errors: { loc: Loc; message: string }[] = [];
  const plan: AdapterPlan = { prelude: [], args: [], after: [], copies: [] };
  const success = constMacro(model, 'SUCCESS') ?? 'TSN_SUCCESS';
  for (const vp of o.params) {
    if (!core.params.some((p) => p.name === vp.name)) {
      errors.push({ loc: vp.loc, message: `v${version} parameter '${vp.name}' has no core parameter of that name` });
    }
  }
  for (const p of core.params) {
    const vp = o.params.find((q) => q.name === p.name);
    if (!vp) {
      plan.args.push(core.fills.find((f) => f.param === p.name)?.expr ?? defaultArg(model, p.type));
      continue;
    }
    const vt = cType(model, vp.type, version);
    const ct = cType(model, p.type, null);
    const count = core.counts.find((c) => c.param === p.name);
    if (vt === ct || (p.type.kind === 'ptr' && p.type.constTo && vp.type.kind === 'ptr' && cType(model, vp.type.to, version) === cType(model, p.type.to, null))) {
      plan.args.push(p.name);
    } else if (isScalar(vp.type, 'int') && isScalar(p.type, 'size_t')) {
      plan.args.push(`(size_t)${p.name}`);
    } else if (count && vp.type.kind === 'ptr' && p.type.kind === 'ptr' && isScalar(vp.type.to, 'int') && isScalar(p.type.to, 'size_t')) {
      const max = constMacro(model, count.max);
      if (!max) {
        errors.push({ loc: core.loc, message: `@count ${p.name}: unknown constant '${count.max}'` });
        continue;
      }
      const wide = `${p.name}_wide`;
      // A count out of range passes through with no array: the core rejects it with a WARN.
      const fits = `${p.name}_fits`;
      plan.prelude.push(
        `size_t ${wide}[${max}];`,
        `const int ${fits} = ${p.name} != NULL && ${count.by} >= 0 && ${count.by} <= ${max};`,
        `if (${fits}) for (int i = 0; i < ${count.by}; i++) ${wide}[i] = (size_t)${p.name}[i];`,
      );
      plan.args.push(`${fits} ? ${wide} : NULL`);
    } else if (vp.type.kind === 'ptr' && p.type.kind === 'ptr' && !p.type.constTo && vp.type.to.kind === 'struct' &&
      p.type.to.kind === 'struct' && vp.type.to.name === p.type.to.name && structNamed(model, p.type.to.name).versioned) {
      const all = `${p.name}_all`;
      plan.prelude.push(`${ct.slice(0, -1)} ${all};`, `memset(&${all}, 0, sizeof(${all}));`);
      plan.args.push(`&${all}`);
      plan.after.push(`if (rc == ${success}) ${copyFnName(model, p.type.to.name, version)}(${p.name}, &${all});`);
      plan.copies.push([p.type.to.name, version]);
    } else {
      errors.push({ loc: vp.loc, message: `v${version} parameter '${p.name}': no conversion from ${vt} to core ${ct}` });
    }
  }
  return errors.length ? { errors } : plan;
}
