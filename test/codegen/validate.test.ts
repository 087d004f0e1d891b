// Broken definitions are reported as `file:line: message`, before anything is emitted.
import * as fs from 'fs';
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { AbiError, formatDiagnostic } from '../../codegen/diagnostics';
import { inspectAbi } from '../../codegen/inspect';
import { ROOT } from '../../codegen/paths';
import { validate } from '../../codegen/validate';

const FIXTURES = 'test/codegen/fixtures';

/** `file:line` of the first line of a fixture containing `text`. */
function at(fixture: string, text: string): string {
  const file = `${FIXTURES}/${fixture}/abi.ts`;
  const line = fs.readFileSync(path.join(ROOT, file), 'utf8').split('\n').findIndex((l) => l.includes(text)) + 1;
  expect(line, text).toBeGreaterThan(0);
  return `${file}:${line}`;
}

function problems(run: () => void): string[] {
  try {
    run();
  } catch (e) {
    if (e instanceof AbiError) return e.diagnostics.map(formatDiagnostic);
    throw e;
  }
  return [];
}

describe('validator', () => {
  it('reports gaps, overlaps, missing cores and unmappable parameters with file:line', () => {
    const model = inspectAbi(path.join(ROOT, FIXTURES, 'slots'), ROOT);
    expect(problems(() => validate(model)).sort()).toEqual([
      `${at('slots', 'init(logger: I32): Result;')}: slot 'init': v7 has neither a signature nor @absent`,
      `${at('slots', 'init(logger: I32): Result;')}: slot 'init' is implemented and needs exactly one @core overload, found 0`,
      `${at('slots', 'devices(ndev: Ptr<I32>): Result;')}: slot 'devices': v7 is declared 2 times`,
      `${at('slots', 'listen(devv: I32)')}: slot 'listen': v6 parameter 'devv' has no core parameter of that name`,
      `${at('slots', 'listen(devv: I32)')}: slot 'listen': v7 parameter 'devv' has no core parameter of that name`,
      `${at('slots', 'regMrDmaBuf(fd: I32)')}: slot 'regMrDmaBuf' is @unimplemented but has a @core overload`,
      `${at('slots', 'accept(dev: I32): Result;')}: @fill belongs on the @core overload of 'accept'`,
      `${at('slots', 'accept(dev: I32, ctx: I32)')}: @fill comm: no such parameter`,
    ].sort());
  });
  it('reports struct mistakes with file:line', () => {
    const model = inspectAbi(path.join(ROOT, FIXTURES, 'structs'), ROOT);
    expect(problems(() => validate(model))).toEqual([
      `${at('structs', 'latency: F32;')}: member 'latency' of @fields struct Props needs a @field kind that FieldKind defines`,
      `${at('structs', 'devs: I32[];')}: array 'devs' has no @length for v7`,
    ]);
  });
  it('passes the real definitions', () => {
    expect(problems(() => validate(inspectAbi(path.join(ROOT, 'plugin/abi'), ROOT)))).toEqual([]);
  });
});

describe('inspector', () => {
  it('reports unknown types and bad version ranges with file:line', () => {
    expect(problems(() => inspectAbi(path.join(ROOT, FIXTURES, 'types'), ROOT))).toEqual([
      `${at('types', 'devices(ndev: Wat)')}: unknown C type 'Wat' (use an alias of ctypes.ts, Ptr<>, Const<> or an ABI struct)`,
      `${at('types', '@versions 5..')}: version range '5..' is outside 6..7`,
    ]);
  });
});
