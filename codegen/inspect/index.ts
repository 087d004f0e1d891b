// Reads plugin/abi/*.ts with ts-morph into the ABI model (inspect step).
import * as path from 'path';
import {
  EnumDeclaration, InterfaceDeclaration, MethodSignature, Node, ParameterDeclaration, Project,
  PropertySignature, SourceFile, SyntaxKind, TypeAliasDeclaration,
} from 'ts-morph';
import { Reporter } from '../diagnostics';
import type {
  AbiModel, ConstGroup, FnType, MemberDef, Overload, SlotDef, StructDef, TableDef, TypedefDef,
} from '../model';
import { Doc, locOf, parseRange, readDoc, tag, tagLoc } from './tags';
import { resolveType, TypeScope } from './types';

/** Loads the definition files of a directory (generated files excluded). */
function load(dir: string): SourceFile[] {
  const project = new Project({ skipAddingFilesFromTsConfig: true, skipFileDependencyResolution: true });
  return project
    .addSourceFilesAtPaths(path.join(dir, '*.ts').split(path.sep).join('/'))
    .filter((f) => !f.getBaseName().endsWith('.generated.ts'))
    .sort((a, b) => a.getFilePath().localeCompare(b.getFilePath()));
}

/** Reads a numeric literal, optionally negated; null otherwise. */
function numberOf(node: Node | undefined): number | null {
  if (!node) return null;
  if (Node.isNumericLiteral(node)) return node.getLiteralValue();
  if (Node.isPrefixUnaryExpression(node) && node.getOperatorToken() === SyntaxKind.MinusToken) {
    const v = numberOf(node.getOperand());
    return v === null ? null : -v;
  }
  return null;
}

class Inspector {
  readonly rep = new Reporter();
  private versions: number[] = [];
  private scope: TypeScope = { scalars: new Map(), typedefs: new Set(), structs: new Set() };

  constructor(private readonly root: string) {}

  run(files: SourceFile[]): AbiModel {
    this.versions = this.readVersions(files);
    const aliases = files.flatMap((f) => f.getTypeAliases());
    const interfaces = files.flatMap((f) => f.getInterfaces());
    for (const a of aliases) {
      const doc = readDoc(a);
      const c = tag(doc, 'ctype');
      if (tag(doc, 'cname') !== null) this.scope.typedefs.add(a.getName());
      else if (c !== null) this.scope.scalars.set(a.getName(), { c, field: tag(doc, 'field') });
    }
    const structs = interfaces.filter((i) => tag(readDoc(i), 'cname') !== null && tag(readDoc(i), 'export') === null);
    for (const s of structs) this.scope.structs.add(s.getName());
    const tables = interfaces.filter((i) => tag(readDoc(i), 'export') !== null);
    const typedefs = aliases.filter((a) => this.scope.typedefs.has(a.getName())).map((a) => this.typedef(a));
    const structDefs = structs.map((s) => this.struct(s));
    const constants = files.flatMap((f) => f.getEnums()).filter((e) => tag(readDoc(e), 'cprefix') !== null).map((e) => this.constGroup(e));
    if (tables.length !== 1) {
      const loc = tables[1] ? locOf(tables[1], this.root) : { file: path.relative(this.root, files[0]?.getFilePath() ?? '.'), line: 1 };
      this.rep.error(loc, `want exactly one table interface tagged @export, found ${tables.length}`);
    }
    const table = tables[0] ? this.table(tables[0]) : { name: '', cname: '', exportName: '', doc: '', slots: [], loc: { file: '', line: 0 } };
    return { versions: this.versions, typedefs, structs: structDefs, table, constants };
  }

  private readVersions(files: SourceFile[]): number[] {
    for (const f of files) {
      const decl = f.getVariableDeclaration('ABI_VERSIONS');
      if (!decl) continue;
      let init = decl.getInitializer();
      if (init && Node.isAsExpression(init)) init = init.getExpression();
      const values = init && Node.isArrayLiteralExpression(init) ? init.getElements().map(numberOf) : [];
      if (values.length === 0 || values.some((v, i) => v === null || (i > 0 && v <= (values[i - 1] ?? 0)))) {
        this.rep.error(locOf(decl, this.root), 'ABI_VERSIONS must be a non-empty ascending array of numbers');
        return [];
      }
      return values as number[];
    }
    this.rep.error({ file: path.relative(this.root, files[0]?.getFilePath() ?? '.'), line: 1 }, 'no ABI_VERSIONS array');
    return [];
  }

  private range(doc: Doc, name: string, node: Node, fallback: number[]): number[] {
    const text = tag(doc, name);
    return text === null ? fallback : parseRange(text, this.versions, tagLoc(doc, name, node, this.root), this.rep);
  }

  private fnType(params: ParameterDeclaration[], ret: Node | undefined, node: Node): FnType {
    const loc = locOf(node, this.root);
    const variadic = params.some((p) => p.isRestParameter());
    const fixed = params.filter((p) => !p.isRestParameter());
    const out = fixed.map((p) => {
      const ploc = locOf(p, this.root);
      const t = p.getTypeNode();
      if (!t) this.rep.error(ploc, `parameter ${p.getName()} has no type`);
      return { name: p.getName(), type: t ? resolveType(t, this.scope, ploc, this.rep) : { kind: 'void' as const }, loc: ploc };
    });
    const retType = ret && Node.isTypeNode(ret) ? resolveType(ret, this.scope, loc, this.rep) : { kind: 'void' as const };
    return { params: out, ret: retType, variadic };
  }

  private typedef(a: TypeAliasDeclaration): TypedefDef {
    const doc = readDoc(a);
    const loc = locOf(a, this.root);
    const t = a.getTypeNode();
    const fn = t && Node.isFunctionTypeNode(t) ? this.fnType(t.getParameters(), t.getReturnTypeNode(), a) : null;
    const scalar = tag(doc, 'ctype');
    if (!fn && scalar === null) this.rep.error(loc, `typedef ${a.getName()} needs @ctype or a function type`);
    return { alias: a.getName(), cname: tag(doc, 'cname') ?? '', doc: doc.text, scalar, fn, loc };
  }

  private member(p: PropertySignature, structVersions: number[]): MemberDef {
    const doc = readDoc(p);
    const loc = locOf(p, this.root);
    let typeNode = p.getTypeNode();
    let lengths: Map<number, number> | null = null;
    const since = tag(doc, 'since');
    const until = tag(doc, 'until');
    const versions = structVersions.filter(
      (v) => (since === null || v >= Number(since)) && (until === null || v <= Number(until)),
    );
    if ((since !== null && !this.versions.includes(Number(since))) || (until !== null && !this.versions.includes(Number(until)))) {
      this.rep.error(tagLoc(doc, since !== null ? 'since' : 'until', p, this.root), `@since/@until of ${p.getName()} names an unknown version`);
    }
    if (typeNode && Node.isArrayTypeNode(typeNode)) {
      typeNode = typeNode.getElementTypeNode();
      lengths = new Map();
      for (const text of doc.tags.get('length') ?? []) {
        const [n, range] = text.split(/\s+/);
        const lengthLoc = tagLoc(doc, 'length', p, this.root);
        for (const v of range ? parseRange(range, this.versions, lengthLoc, this.rep) : versions) lengths.set(v, Number(n));
        if (!(Number(n) > 0)) this.rep.error(lengthLoc, `bad @length '${text}'`);
      }
    }
    if (!typeNode) this.rep.error(loc, `member ${p.getName()} has no type`);
    return {
      name: p.getName(),
      doc: doc.text,
      type: typeNode ? resolveType(typeNode, this.scope, loc, this.rep) : { kind: 'void' },
      versions,
      lengths,
      countedBy: tag(doc, 'countedBy'),
      loc,
    };
  }

  private struct(i: InterfaceDeclaration): StructDef {
    const doc = readDoc(i);
    const versions = this.range(doc, 'versions', i, this.versions);
    const members = i.getProperties().map((p) => this.member(p, versions));
    for (const m of i.getMethods()) this.rep.error(locOf(m, this.root), `struct ${i.getName()} cannot have methods`);
    const varies = (m: MemberDef) =>
      m.versions.length !== versions.length || (m.lengths !== null && new Set(m.lengths.values()).size > 1);
    return {
      name: i.getName(),
      cname: tag(doc, 'cname') ?? '',
      doc: doc.text,
      versions,
      versioned: members.some(varies),
      field: tag(doc, 'field'),
      fields: doc.tags.has('fields'),
      members,
      loc: locOf(i, this.root),
    };
  }

  private overload(m: MethodSignature): Overload {
    const doc = readDoc(m);
    const counts = (doc.tags.get('count') ?? []).map((t) => {
      const [param, by, max] = t.split(/\s+/);
      if (!max) this.rep.error(locOf(m, this.root), `@count wants 'param count max', got '${t}'`);
      return { param, by, max };
    });
    const fills = (doc.tags.get('fill') ?? []).map((t) => {
      const m2 = /^(\S+)\s+(.+)$/.exec(t);
      if (!m2) this.rep.error(locOf(m, this.root), `@fill wants 'param expression', got '${t}'`);
      return { param: m2?.[1] ?? '', expr: m2?.[2].trim() ?? '' };
    });
    return {
      ...this.fnType(m.getParameters(), m.getReturnTypeNode(), m),
      doc: doc.text,
      versions: this.range(doc, 'versions', m, []),
      core: doc.tags.has('core'),
      counts,
      fills,
      loc: locOf(m, this.root),
    };
  }

  private table(i: InterfaceDeclaration): TableDef {
    const doc = readDoc(i);
    const slots: SlotDef[] = [];
    for (const m of i.getMembers()) {
      const mdoc = readDoc(m);
      const loc = locOf(m, this.root);
      const absentLoc = tagLoc(mdoc, 'absent', m, this.root);
      const absent = (mdoc.tags.get('absent') ?? []).flatMap((r) => parseRange(r, this.versions, absentLoc, this.rep));
      if (Node.isPropertySignature(m)) {
        const t = m.getTypeNode();
        const value = tag(mdoc, 'value');
        if (value === null) this.rep.error(loc, `data slot ${m.getName()} needs @value`);
        const versions = this.range(mdoc, 'versions', m, []);
        const data = { type: t ? resolveType(t, this.scope, loc, this.rep) : { kind: 'void' as const }, value: value ?? '', versions };
        slots.push({ name: m.getName(), doc: mdoc.text, data, overloads: [], absent, unimplemented: false, loc });
      } else if (Node.isMethodSignature(m)) {
        let slot = slots.find((s) => s.name === m.getName());
        if (!slot) {
          slot = { name: m.getName(), doc: mdoc.text, data: null, overloads: [], absent: [], unimplemented: false, loc };
          slots.push(slot);
        }
        slot.overloads.push(this.overload(m));
        slot.absent.push(...absent);
        slot.unimplemented ||= mdoc.tags.has('unimplemented');
      } else {
        this.rep.error(loc, 'table members must be properties or method signatures');
      }
    }
    return {
      name: i.getName(),
      cname: tag(doc, 'cname') ?? '',
      exportName: tag(doc, 'export') ?? '',
      doc: doc.text,
      slots,
      loc: locOf(i, this.root),
    };
  }

  private constGroup(e: EnumDeclaration): ConstGroup {
    const doc = readDoc(e);
    const members = e.getMembers().map((m) => {
      const value = numberOf(m.getInitializer());
      const loc = locOf(m, this.root);
      if (value === null) this.rep.error(loc, `${e.getName()}.${m.getName()} needs a numeric literal value`);
      return { name: m.getName(), value: value ?? 0, doc: readDoc(m).text, loc };
    });
    return { name: e.getName(), doc: doc.text, prefix: tag(doc, 'cprefix') ?? '', members, loc: locOf(e, this.root) };
  }
}

/** Reads the definitions in `dir`; throws AbiError listing every problem found. */
export function inspectAbi(dir: string, root: string): AbiModel {
  const inspector = new Inspector(root);
  const model = inspector.run(load(dir));
  inspector.rep.throwIfAny();
  return model;
}
