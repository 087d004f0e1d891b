// Runs a child process without blocking the test worker. vitest's worker answers its runner
// over RPC and gives up after 60 s without an answer ("Timeout calling onTaskUpdate"): a
// synchronous spawn that lasts a minute on a loaded 2-core CI machine fails the whole run.
// Every test that runs a program for more than a moment goes through here.
import { spawn } from 'node:child_process';

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
      resolve({ status: spawnError ? -1 : status, signal, stdout, stderr, seconds: (Date.now() - t0) / 1000 });
    });
  });
}
