// The machine description recorded with every result.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';

export interface Machine {
  hostname: string;
  os: string; // PRETTY_NAME of /etc/os-release, else os.type()
  kernel: string;
  arch: string;
  cpuModel: string;
  cores: number; // logical CPUs Node sees
  memoryBytes: number;
  node: string;
  cc: string; // first line of `cc --version`
  tsnetCommit: string; // git HEAD, "+dirty" when the tree has changes
  env: Record<string, string>; // every TSNET_* and NCCL_* variable the tsnet processes got
}

function quiet(cmd: string, args: string[], cwd: string): string {
  try {
    return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'unknown';
  }
}

export function describeMachine(root: string, env: NodeJS.ProcessEnv): Machine {
  let osName = `${os.type()}`;
  try {
    const m = /^PRETTY_NAME="?([^"\n]*)"?/m.exec(fs.readFileSync('/etc/os-release', 'utf8'));
    if (m) osName = m[1];
  } catch {
    // not Linux, or no os-release: keep os.type()
  }
  const commit = quiet('git', ['rev-parse', 'HEAD'], root);
  const dirty = commit !== 'unknown' && quiet('git', ['status', '--porcelain', '--untracked-files=no'], root) !== '';
  const knobs: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (/^(TSNET|NCCL)_/.test(k) && v !== undefined) knobs[k] = v;
  const cpus = os.cpus();
  return {
    hostname: os.hostname(),
    os: osName,
    kernel: os.release(),
    arch: os.arch(),
    cpuModel: cpus[0]?.model.trim() ?? 'unknown',
    cores: cpus.length,
    memoryBytes: os.totalmem(),
    node: process.version,
    cc: quiet(process.env.CC || 'cc', ['--version'], root).split('\n')[0],
    tsnetCommit: dirty ? `${commit}+dirty` : commit,
    env: knobs,
  };
}
