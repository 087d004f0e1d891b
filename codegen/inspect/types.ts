// TypeScript type nodes → C types, by the alias and interface names of plugin/abi/.
import { Node, SyntaxKind, TypeNode } from 'ts-morph';
import type { CType, Loc } from '../model';
import type { Reporter } from '../diagnostics';

/** The names a type node may refer to. */
export interface TypeScope {
  scalars: Map<string, { c: string; field: string | null }>;
  typedefs: Set<string>;
  structs: Set<string>;
}

function isNull(n: TypeNode): boolean {
  return Node.isLiteralTypeNode(n) && n.getLiteral().getKind() === SyntaxKind.NullKeyword;
}

/** Resolves a type node; reports and returns void on anything unknown. */
export function resolveType(node: TypeNode, scope: TypeScope, loc: Loc, rep: Reporter): CType {
  if (node.getKind() === SyntaxKind.VoidKeyword) return { kind: 'void' };
  if (Node.isUnionTypeNode(node)) {
    const rest = node.getTypeNodes().filter((t) => !isNull(t));
    if (rest.length === 1) return resolveType(rest[0], scope, loc, rep);
  }
  if (Node.isTypeReference(node)) {
    const name = node.getTypeName().getText();
    const args = node.getTypeArguments();
    if (name === 'Ptr' && args.length === 1) {
      const inner = args[0];
      if (Node.isTypeReference(inner) && inner.getTypeName().getText() === 'Const') {
        const to = resolveType(inner.getTypeArguments()[0], scope, loc, rep);
        if (to.kind === 'ptr') rep.error(loc, 'Const<> of a pointer is not supported');
        return { kind: 'ptr', to, constTo: true };
      }
      return { kind: 'ptr', to: resolveType(inner, scope, loc, rep), constTo: false };
    }
    const scalar = scope.scalars.get(name);
    if (scalar && args.length === 0) return { kind: 'scalar', alias: name, c: scalar.c, field: scalar.field };
    if (scope.typedefs.has(name)) return { kind: 'typedef', alias: name };
    if (scope.structs.has(name)) return { kind: 'struct', name };
  }
  rep.error(loc, `unknown C type '${node.getText()}' (use an alias of ctypes.ts, Ptr<>, Const<> or an ABI struct)`);
  return { kind: 'void' };
}
