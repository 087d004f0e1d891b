// The C compiler's layout of every generated struct, against the doc (transcribed and parsed)
// and against plugin/abi/layout.generated.ts.
import * as fs from 'fs';
import * as path from 'path';
import { beforeAll, describe, expect, it } from 'vitest';
import { layouts, propsFields } from '../../plugin/abi/layout.generated';
import { compileRun, ROOT } from './cc';
import { parseDoc } from './doc';
import { EXPECTED, VERSIONS } from './expected';

type CLayout = Record<string, { size: number; members: Record<string, [number, number]> }>;

const DOC = path.resolve(ROOT, '../shared/docs/ncclnet-abi.md');
let c: CLayout;

beforeAll(() => {
  const r = compileRun('layout', ['test/layout/layout.c'], ['-I', path.join(ROOT, 'test/layout')]);
  expect(r.status, r.stderr).toBe(0);
  c = JSON.parse(r.stdout) as CLayout;
});

function offsets(name: string): Record<string, number> {
  return Object.fromEntries(Object.entries(c[name].members).map(([m, [off]]) => [m, off]));
}

describe('C layout vs. the layouts transcribed from the doc (expected.ts)', () => {
  it('covers the same structs', () => {
    expect(Object.keys(c).sort()).toEqual(Object.keys(EXPECTED).sort());
  });
  for (const [name, want] of Object.entries(EXPECTED)) {
    it(`${name}: sizeof ${want.size} and every member offset`, () => {
      expect(c[name].size).toBe(want.size);
      expect(offsets(name)).toEqual(want.offsets);
    });
  }
});

describe('C layout vs. the doc itself', () => {
  const present = fs.existsSync(DOC);
  it.skipIf(!present)('parses the doc', () => {
    const doc = parseDoc(DOC);
    expect(doc.versions).toEqual(VERSIONS);
  });
  if (!present) {
    it.skip(`doc absent at ${DOC}: the checks against the doc's own tables are skipped`, () => {});
    return;
  }
  const doc = parseDoc(DOC);
  for (const v of doc.versions) {
    it(`props v${v}: sizeof and offsets of the doc's table`, () => {
      const want: Record<string, number> = {};
      doc.props.forEach((cells, member) => cells.has(v) && (want[member] = cells.get(v)!));
      expect(c[`tsn_props_v${v}_t`].size).toBe(doc.propsSize.get(v));
      expect(offsets(`tsn_props_v${v}_t`)).toEqual(want);
    });
    it(`table v${v}: size and slot order of the doc`, () => {
      const want = Object.fromEntries(doc.slots.filter((s) => v >= s.since).map((s, i) => [s.name, 8 * i]));
      expect(c[`tsn_net_v${v}_t`].size).toBe(doc.tableSize.get(v));
      expect(offsets(`tsn_net_v${v}_t`)).toEqual(want);
    });
  }
  it('vProps.devs lengths, device handle and net attributes sizes', () => {
    doc.vpropsDevs.forEach((len, v) => expect(c[`tsn_vprops_v${v}_t`].members.devs[1]).toBe(4 * len));
    expect(doc.vpropsDevs.size).toBe(4);
    expect(c.tsn_dev_handle_t.size).toBe(doc.devHandleSize);
    expect(c.tsn_net_attr_t.size).toBe(doc.netAttrSize);
  });
});

describe('C layout vs. plugin/abi/layout.generated.ts', () => {
  it('has the same structs', () => {
    expect(Object.keys(layouts).sort()).toEqual(Object.keys(c).sort());
  });
  for (const name of Object.keys(layouts)) {
    it(`${name}: size, offsets and member sizes`, () => {
      expect(layouts[name].size).toBe(c[name].size);
      expect(Object.fromEntries(layouts[name].members.map((m) => [m.name, [m.offset, m.size]]))).toEqual(c[name].members);
    });
  }
  it('the tsn_props_t field descriptors sit at the C offsets', () => {
    expect(Object.fromEntries(propsFields.map((f) => [f.name, f.offset]))).toEqual(offsets('tsn_props_t'));
  });
});

describe('the header', () => {
  it('compiles as C++ too', () => {
    const r = compileRun('cxx', ['test/layout/cxx_include.cc'], [], true);
    expect(r.status).toBe(0);
  });
});
