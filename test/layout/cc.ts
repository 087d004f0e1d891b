// Compiling and running the C test programs.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

/** The repository root. */
export const ROOT = path.resolve(__dirname, '../..');

/** Compiles C (or, with `cxx`, C++) sources given relative to the root into a temp dir; returns the binary. */
export function compile(name: string, sources: string[], flags: string[] = [], cxx = false): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-test-'));
  const out = path.join(dir, name);
  const args = [cxx ? '-std=c++17' : '-std=c11', '-Wall', '-Wextra', '-Werror', '-I', path.join(ROOT, 'native/generated'), ...flags];
  execFileSync(cxx ? 'c++' : 'cc', [...args, ...sources.map((s) => path.join(ROOT, s)), '-o', out], { stdio: 'pipe' });
  return out;
}

/** Compiles as compile() does, runs the binary once and removes it with its temp dir. */
export function compileRun(name: string, sources: string[], flags: string[] = [], cxx = false): ReturnType<typeof run> {
  const bin = compile(name, sources, flags, cxx);
  try {
    return run(bin);
  } finally {
    fs.rmSync(path.dirname(bin), { recursive: true, force: true });
  }
}

/** Runs a binary; returns its exit status and output. */
export function run(binary: string): { status: number; stdout: string; stderr: string } {
  try {
    return { status: 0, stdout: execFileSync(binary, { encoding: 'utf8', stdio: 'pipe' }), stderr: '' };
  } catch (e) {
    const err = e as { status: number; stdout: string; stderr: string };
    return { status: err.status, stdout: String(err.stdout), stderr: String(err.stderr) };
  }
}
