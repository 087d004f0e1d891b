// Where libfabric.so.1 is, for the benchmark's libfabric series (TSNET_TRANSPORT=ofi). The
// plugin opens it with dlopen (TSNET_LIBFABRIC, else "libfabric.so.1"); the benchmark looks
// for it the same way a loader would, and hands the path it found to the plugin as
// TSNET_LIBFABRIC so that both mean the same library.
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const LIBFABRIC = 'libfabric.so.1';

export interface Libfabric {
  path: string;
  foundBy: 'TSNET_LIBFABRIC' | 'LD_LIBRARY_PATH' | 'lib dirs' | 'ldconfig -p';
}

export type Found = { found: Libfabric } | { why: string };

/** The usual library folders, the Debian multiarch one of this machine included. */
export function usualLibDirs(arch: string = process.arch): string[] {
  const triplet = { x64: 'x86_64-linux-gnu', arm64: 'aarch64-linux-gnu', ppc64: 'powerpc64le-linux-gnu' }[arch];
  const multi = triplet ? [`/usr/lib/${triplet}`, `/lib/${triplet}`] : [];
  return ['/usr/local/lib64', '/usr/local/lib', ...multi, '/usr/lib64', '/usr/lib', '/lib64', '/lib', '/opt/amazon/efa/lib64', '/opt/amazon/efa/lib'];
}

function ldconfigPrint(): string {
  for (const cmd of ['ldconfig', '/sbin/ldconfig', '/usr/sbin/ldconfig']) {
    try {
      return execFileSync(cmd, ['-p'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 10_000 });
    } catch {
      // not on PATH here, or it failed: try the next
    }
  }
  return '';
}

export interface FindOptions {
  dirs?: string[]; // instead of usualLibDirs()
  ldconfig?: () => string; // instead of running `ldconfig -p`
  exists?: (p: string) => boolean;
}

/** TSNET_LIBFABRIC, then the LD_LIBRARY_PATH folders, the usual lib folders, then `ldconfig -p`. */
export function findLibfabric(env: NodeJS.ProcessEnv, opt: FindOptions = {}): Found {
  const exists = opt.exists ?? ((p: string) => fs.existsSync(p));
  const forced = env.TSNET_LIBFABRIC;
  if (forced) {
    // The plugin opens exactly this, so nothing else is looked for.
    return exists(forced)
      ? { found: { path: path.resolve(forced), foundBy: 'TSNET_LIBFABRIC' } }
      : { why: `TSNET_LIBFABRIC=${forced} does not exist` };
  }
  for (const dir of (env.LD_LIBRARY_PATH ?? '').split(':').filter((d) => d !== '')) {
    const p = path.resolve(dir, LIBFABRIC);
    if (exists(p)) return { found: { path: p, foundBy: 'LD_LIBRARY_PATH' } };
  }
  const dirs = opt.dirs ?? usualLibDirs();
  for (const dir of dirs) {
    const p = path.join(dir, LIBFABRIC);
    if (exists(p)) return { found: { path: p, foundBy: 'lib dirs' } };
  }
  const listing = (opt.ldconfig ?? ldconfigPrint)();
  for (const line of listing.split('\n')) {
    const m = /^\s*libfabric\.so\.1\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$/.exec(line);
    if (m && exists(m[2])) return { found: { path: m[2], foundBy: 'ldconfig -p' } };
  }
  return {
    why: `${LIBFABRIC} not found (TSNET_LIBFABRIC is unset; not in LD_LIBRARY_PATH, ${dirs.join(', ')}, nor in ldconfig -p); install libfabric (Debian: libfabric1) or set TSNET_LIBFABRIC`,
  };
}
