// Compiles the generated tables with a fake core and runs adapters.c through every version.
import { describe, expect, it } from 'vitest';
import { compileRun, ROOT } from '../layout/cc';
import * as path from 'path';

describe('generated adapters (tsnet_tables.c)', () => {
  it('forward every version\'s arguments to the core as adapters.c expects', () => {
    const r = compileRun('adapters', ['test/codegen/adapters.c', 'test/codegen/fake_core.c', 'native/generated/tsnet_tables.c'], [
      '-I', path.join(ROOT, 'test/layout'),
    ]);
    expect(r.stdout).toMatch(/^\d+ checks, 0 failed$/m);
    expect(r.stdout).not.toContain('FAIL');
    expect(r.status).toBe(0);
  });
});
