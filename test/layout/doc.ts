// Parses the layout facts out of docs/ncclnet-abi.md (the shared ABI doc).
import * as fs from 'fs';

/** What the doc's tables say, as per-version offsets and sizes. */
export interface DocFacts {
  versions: number[];
  /** member → version → offset */
  props: Map<string, Map<number, number>>;
  propsSize: Map<number, number>;
  /** slots in order with the first version that has each */
  slots: { name: string; since: number }[];
  tableSize: Map<number, number>;
  vpropsDevs: Map<number, number>;
  devHandleSize: number;
  netAttrSize: number;
}

function rows(lines: string[], heading: string): string[][] {
  const start = lines.findIndex((l) => l.startsWith(heading));
  if (start < 0) throw new Error(`doc: no section '${heading}'`);
  const out: string[][] = [];
  for (const line of lines.slice(start + 1)) {
    if (line.startsWith('## ')) break;
    if (!line.startsWith('|') || /^\|[-| ]+\|$/.test(line)) continue;
    out.push(line.slice(1, -1).split('|').map((c) => c.trim()));
  }
  return out;
}

function num(text: string, what: string): number {
  const m = new RegExp(text).exec(what);
  if (!m) throw new Error(`doc: no match for ${text}`);
  return Number(m[1]);
}

/** Reads the doc at `file`. */
export function parseDoc(file: string): DocFacts {
  const text = fs.readFileSync(file, 'utf8');
  const lines = text.split('\n');
  const propRows = rows(lines, '## Properties struct');
  const versions = propRows[0].slice(2).map((h) => Number(h.replace(/^v/, '')));
  const props = new Map<string, Map<number, number>>();
  const propsSize = new Map<number, number>();
  for (const r of propRows.slice(1)) {
    const name = /^[A-Za-z0-9]+/.exec(r[0])![0];
    const cells = new Map<number, number>();
    versions.forEach((v, i) => /^\d+/.test(r[2 + i]) && cells.set(v, parseInt(r[2 + i], 10)));
    if (name === 'sizeof') cells.forEach((s, v) => propsSize.set(v, s));
    else props.set(name, cells);
  }
  const slots = rows(lines, '## Function table').slice(1).map((r) => ({
    name: r[1],
    since: /^v(\d+)\+/.test(r[2]) ? Number(/^v(\d+)\+/.exec(r[2])![1]) : versions[0],
  }));
  const tableSize = new Map<number, number>();
  const sizes = /Sizes of the tables: ([^.]*) bytes/.exec(text)![1];
  for (const part of sizes.split(',')) {
    const [vs, size] = part.trim().split(/\s+/);
    for (const v of vs.split('/')) tableSize.set(Number(v.replace(/^v/, '')), Number(size));
  }
  const vpropsDevs = new Map<number, number>();
  const devs = /vProps\.devs length \| ([^|]*) \|/.exec(text)![1];
  for (const m of devs.matchAll(/(\d+) \(v(\d+)(?:–v(\d+))?\)/g)) {
    for (let v = Number(m[2]); v <= Number(m[3] ?? m[2]); v++) vpropsDevs.set(v, Number(m[1]));
  }
  return {
    versions, props, propsSize, slots, tableSize, vpropsDevs,
    devHandleSize: num('Device handle[\\s\\S]*?\\((\\d+) bytes\\)', text),
    netAttrSize: num('Net attributes[\\s\\S]*?\\((\\d+) bytes\\)', text),
  };
}
