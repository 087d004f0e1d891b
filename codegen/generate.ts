// inspect → validate → emit: the generated files, in memory.
import * as fs from 'fs';
import * as path from 'path';
import { emitAbiHeader } from './emit/emitAbiHeader';
import type { Emitter } from './emit/emitter';
import { emitLayout } from './emit/emitLayout';
import { emitTables } from './emit/emitTables';
import { inspectAbi } from './inspect';
import { ABI_DIR, ROOT } from './paths';
import { validate } from './validate';

/** Every emitter, one per generated file. */
export const EMITTERS: Emitter[] = [emitAbiHeader, emitTables, emitLayout];

/** One generated file: path relative to the root, and its content. */
export interface Generated {
  path: string;
  content: string;
}

/** Reads and validates plugin/abi/, then runs the emitters (all, or those whose output is named). */
export function generate(only: string[] = [], abiDir = ABI_DIR): Generated[] {
  const model = inspectAbi(abiDir, ROOT);
  validate(model);
  return EMITTERS.filter((e) => only.length === 0 || only.includes(e.output)).map((e) => ({ path: e.output, content: e.emit(model) }));
}

/** Generated files whose committed content differs from `files`. */
export function staleFiles(files: Generated[]): string[] {
  return files.filter((f) => {
    const full = path.join(ROOT, f.path);
    return !fs.existsSync(full) || fs.readFileSync(full, 'utf8') !== f.content;
  }).map((f) => f.path);
}
