// Runs a child process without blocking the test worker. vitest's worker answers its runner
// over RPC and gives up after 60 s without an answer ("Timeout calling onTaskUpdate"): a
// synchronous spawn that lasts a minute on a loaded 2-core CI machine fails the whole run.
// Every test that runs a program for more than a moment goes through here.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

/**
 * Native crash reports of this test run: the C driver's roles print `CRASH: pid ...` and the
 * native stack when they fault (test/driver/driver.c). scripts/test.sh prints this file at the
 * very end of a failed run, where CI's excerpt of the output still shows it.
 */
export const CRASH_LOG = path.resolve(__dirname, '../../build/test/crash-reports.log');

const FAULTS = new Set(['SIGSEGV', 'SIGBUS', 'SIGILL', 'SIGFPE', 'SIGABRT']);

/** Appends what a run that faulted said about it to CRASH_LOG (never throws). */
export function recordCrash(cmd: string, args: string[], r: Ran, file = CRASH_LOG): void {
  const lines = `${r.stdout}\n${r.stderr}`.split('\n');
  const at: number[] = [];
  lines.forEach((l, i) => {
    if (/CRASH: pid \d+|died of signal (7|4|8|11|6)\b/.test(l)) at.push(i);
  });
  if (!at.length && !(r.signal && FAULTS.has(r.signal))) return;
  const blocks = at.map((i) => lines.slice(i, /CRASH: pid/.test(lines[i]) ? i + 40 : i + 1).join('\n'));
  const head = `--- ${path.basename(cmd)} ${args.join(' ')}: status ${r.status}, signal ${r.signal ?? 'none'}`;
  try {
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.appendFileSync(file, `${head}\n${blocks.join('\n') || '(the process printed no crash report)'}\n`);
  } catch {
    // a report that cannot be written must not fail the test that found the crash
  }
}

/**
 * libfabric shm regions that test programs left in /dev/shm: shm names an endpoint's 16 MiB
 * region "<pid>:<uid>:<index>" and removes it when the endpoint closes, so one named for a
 * program that has ended is a leak (an endpoint never closed, or closed after the process had
 * gone past its exit handlers). scripts/test.sh prints this file at the end of every run.
 */
export const SHM_LEFT_LOG = path.resolve(__dirname, '../../build/test/shm-left.log');

/** Removes the regions named for pid, noting them in SHM_LEFT_LOG with the command (never throws). */
export function recordShmLeft(cmd: string, args: string[], pid: number | undefined, file = SHM_LEFT_LOG, dir = '/dev/shm'): string[] {
  if (!pid) return [];
  try {
    const left = fs.readdirSync(dir).filter((f) => f.startsWith(`${pid}:`));
    if (!left.length) return [];
    for (const f of left) fs.rmSync(path.join(dir, f), { force: true });
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.appendFileSync(file, `${path.basename(cmd)} ${args.join(' ')} (pid ${pid}): ${left.map((f) => path.join(dir, f)).join(', ')}\n`);
    return left;
  } catch {
    return []; // a report that cannot be written must not fail the test
  }
}

export interface Ran {
  status: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  seconds: number;
}

export interface RunOptions {
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** Written to the child's standard input, which is then closed. */
  input?: string;
  /** Milliseconds until the child is killed with SIGKILL (like spawnSync's timeout). */
  timeout?: number;
}

export function runAsync(cmd: string, args: string[], opts: RunOptions = {}): Promise<Ran> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.stdin.on('error', () => {}); // a child that exits without reading its input
    child.stdin.end(opts.input ?? '');
    const timer = opts.timeout ? setTimeout(() => child.kill('SIGKILL'), opts.timeout) : undefined;
    let spawnError: Error | undefined;
    child.on('error', (e) => (spawnError = e));
    child.on('close', (status, signal) => {
      if (timer) clearTimeout(timer);
      if (spawnError) stderr += `${stderr ? '\n' : ''}spawn ${cmd}: ${spawnError.message}`;
      const r = { status: spawnError ? -1 : status, signal, stdout, stderr, seconds: (Date.now() - t0) / 1000 };
      recordCrash(cmd, args, r);
      recordShmLeft(cmd, args, child.pid);
      resolve(r);
    });
  });
}
