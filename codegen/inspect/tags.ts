// JSDoc reading: a one-line description and the custom tags of a declaration.
import { Node } from 'ts-morph';
import type { Loc } from '../model';
import type { Reporter } from '../diagnostics';
import * as path from 'path';

/** The description and tags (name → texts, in order) of a declaration's JSDoc. */
export interface Doc {
  text: string;
  tags: Map<string, string[]>;
  /** Line of the first occurrence of each tag. */
  lines: Map<string, number>;
}

/** Reads the JSDoc blocks directly attached to a node. */
export function readDoc(node: Node): Doc {
  const tags = new Map<string, string[]>();
  const lines = new Map<string, number>();
  let text = '';
  const docs = Node.isJSDocable(node) ? node.getJsDocs() : [];
  for (const doc of docs) {
    const desc = doc.getDescription().trim();
    if (desc) text = desc.split('\n')[0].trim();
    for (const tag of doc.getTags()) {
      const list = tags.get(tag.getTagName()) ?? [];
      list.push((tag.getCommentText() ?? '').trim());
      tags.set(tag.getTagName(), list);
      if (!lines.has(tag.getTagName())) lines.set(tag.getTagName(), tag.getStartLineNumber());
    }
  }
  return { text, tags, lines };
}

/** The single text of a tag, or null when the tag is absent. */
export function tag(doc: Doc, name: string): string | null {
  return doc.tags.get(name)?.[0] ?? null;
}

/** Location of a node relative to the repository root. */
export function locOf(node: Node, root: string): Loc {
  return { file: path.relative(root, node.getSourceFile().getFilePath()), line: node.getStartLineNumber() };
}

/** Location of a tag in a node's JSDoc (the node's own line when the tag is absent). */
export function tagLoc(doc: Doc, name: string, node: Node, root: string): Loc {
  return { ...locOf(node, root), line: doc.lines.get(name) ?? node.getStartLineNumber() };
}

/**
 * Parses a version range: `9` (one), `6..9` (inclusive), `11..` (to the newest).
 * Reports and returns [] on a malformed range or a version not in `versions`.
 */
export function parseRange(text: string, versions: number[], loc: Loc, rep: Reporter): number[] {
  const m = /^(\d+)(\.\.(\d+)?)?$/.exec(text.trim());
  if (!m) {
    rep.error(loc, `bad version range '${text}' (want N, N..M or N..)`);
    return [];
  }
  const lo = Number(m[1]);
  const hi = m[2] === undefined ? lo : m[3] === undefined ? Math.max(...versions) : Number(m[3]);
  if (!versions.includes(lo) || !versions.includes(hi) || hi < lo) {
    rep.error(loc, `version range '${text}' is outside ${versions[0]}..${versions[versions.length - 1]}`);
    return [];
  }
  return versions.filter((v) => v >= lo && v <= hi);
}
