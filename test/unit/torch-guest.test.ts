// test/torch/: the PyTorch guest suite runs by hand on a GPU machine (docs/testing.md). Here:
// its scripts parse, the runner refuses unknown variants and modes, and, where python3 has a
// PyTorch with gloo, guest.py's checks run on the CPU over gloo in two processes, and a copy
// of it whose checks see one wrong element fails them and exits non-zero.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';

const root = path.resolve(__dirname, '../..');
const guest = path.join(root, 'test/torch/guest.py');
const runner = path.join(root, 'test/torch/run.sh');

const python = spawnSync('python3', ['--version'], { encoding: 'utf8' }).status === 0 ? 'python3' : null;
const torchWhy = (() => {
  if (!python) return 'no python3';
  const r = spawnSync(python, ['-c', 'import torch.distributed as d; assert d.is_gloo_available()'], { encoding: 'utf8', timeout: 60_000 });
  return r.status === 0 ? null : 'python3 has no PyTorch with gloo (apt-get install python3-torch)';
})();

/** Runs guest.py (or a copy) as `world` ranks over gloo; resolves with each rank's exit status and output. */
async function gloo(script: string, args: string[], world = 2): Promise<{ status: number | null; out: string }[]> {
  const port = String(20000 + Math.floor(Math.random() * 20000));
  const ranks = await Promise.all(
    Array.from({ length: world }, (_, rank) => {
      const env = { ...process.env, MASTER_ADDR: '127.0.0.1', MASTER_PORT: port, RANK: String(rank), WORLD_SIZE: String(world), LOCAL_RANK: String(rank), OMP_NUM_THREADS: '1' };
      return runAsync(python!, [script, '--device', 'cpu', ...args], { env, timeout: 240_000 });
    }),
  );
  return ranks.map((r) => ({ status: r.status, out: r.stdout + r.stderr }));
}

describe('test/torch scripts', () => {
  it.skipIf(!python)('guest.py compiles', () => {
    const r = spawnSync(python!, ['-c', `import ast,sys; ast.parse(open(sys.argv[1]).read())`, guest], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it('run.sh and nccl-tests/variants.sh parse, and run.sh refuses an unknown variant or mode', () => {
    for (const f of [runner, path.join(root, 'nccl-tests/variants.sh'), path.join(root, 'nccl-tests/run.sh')])
      expect(spawnSync('bash', ['-n', f]).status).toBe(0);
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-torch-'));
    try {
      const v = spawnSync('bash', [runner, 'python3', 'x.so', out], { env: { ...process.env, VARIANTS: 'tsnet nope' }, encoding: 'utf8' });
      expect(v.status).toBe(2);
      expect(v.stderr).toContain('unknown variant nope');
      const m = spawnSync('bash', [runner, 'python3', 'x.so', out], { env: { ...process.env, MODES: 'check sideways' }, encoding: 'utf8' });
      expect(m.status).toBe(2);
      expect(m.stderr).toContain('unknown mode sideways');
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });

  it.skipIf(!!torchWhy)(`guest.py passes its checks (check and many modes) over gloo on the CPU, and fails them on one wrong element${torchWhy ? ` (skipped: ${torchWhy})` : ''}`, async () => {
    const args = ['--max-elems', '4096', '--steps', '6', '--churn', '2'];
    const good = await gloo(guest, args);
    for (const r of good) {
      expect(r.out).toMatch(/phase collectives: ok/);
      expect(r.out).toMatch(/phase forked children: ok/);
      expect(r.out).toMatch(/fork: 16 batches from forked data loader workers/);
      expect(r.out).toMatch(/phase ddp: ok/);
      expect(r.out).toMatch(/done: 0 failed check\(s\) here, 0 on all ranks/);
      expect(r.status).toBe(0);
    }
    const many = await gloo(guest, ['--mode', 'many', '--groups', '3', '--quiet', '0.2']);
    for (const r of many) {
      expect(r.out).toMatch(/many: 3 communicators up in /);
      expect(r.out).toMatch(/many: after 0\.2 s quiet: an all_reduce of 4096 B on each of 3 communicators/);
      expect(r.out).toMatch(/many: destroyed in .* descriptors/);
      expect(r.out).toMatch(/phase many: ok/);
      expect(r.status).toBe(0);
    }
    // The same script with every received tensor's last element off by one.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-torch-'));
    try {
      const bad = path.join(dir, 'guest.py');
      const src = fs.readFileSync(guest, 'utf8');
      const hook = 'def expect_equal(what, got, want):\n';
      expect(src).toContain(hook);
      fs.writeFileSync(bad, src.replace(hook, `${hook}    got = got.clone()\n    got.view(-1)[-1] += 1\n`));
      const broken = await gloo(bad, args);
      for (const r of broken) {
        expect(r.out).toMatch(/FAIL all_reduce sum n=1 float32: 1 of 1 elements wrong/);
        expect(r.out).toMatch(/phase collectives: FAILED/);
        expect(r.out).toMatch(/FAIL fork: all_reduce after the forked children: 1 of 65536 elements wrong/);
        expect(r.status).toBe(1);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);
});
