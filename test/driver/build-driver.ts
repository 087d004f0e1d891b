// Builds the C driver (test/driver/driver.c + shim.c) into build/test/driver when it is
// missing or older than a source; shared by the driver and netns suites.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

export const ROOT = path.resolve(__dirname, '../..');
export const LIB = path.join(ROOT, 'build/libnccl-net-tsnet.so');
export const BIN = path.join(ROOT, 'build/test/driver');
const SOURCES = ['test/driver/driver.c', 'test/driver/shim.c'].map((s) => path.join(ROOT, s));
const DEPS = [...SOURCES, path.join(ROOT, 'test/driver/shim.h'), path.join(ROOT, 'native/generated/tsnet_abi.h')];

export function buildDriver(): string {
  const built = fs.existsSync(BIN) ? fs.statSync(BIN).mtimeMs : 0;
  if (DEPS.some((d) => fs.statSync(d).mtimeMs > built)) {
    fs.mkdirSync(path.dirname(BIN), { recursive: true });
    // Built under a temporary name and renamed: a suite running the old binary meanwhile is unaffected.
    const tmp = `${BIN}.${process.pid}.tmp`;
    execFileSync(
      'cc',
      ['-std=c11', '-O2', '-Wall', '-Wextra', '-Werror', '-I', path.join(ROOT, 'native/generated'), ...SOURCES, '-o', tmp, '-ldl'],
      { stdio: 'pipe' },
    );
    fs.renameSync(tmp, BIN);
  }
  return BIN;
}

/** Fails with a clear message when the library has not been built. */
export function requireLib(): void {
  if (!fs.existsSync(LIB)) throw new Error(`${LIB} is missing: run \`npm run build\` first`);
}

/** Where Debian's (or another distribution's) libfabric is installed: the ofi suites run, else skip. */
export const HAVE_LIBFABRIC = ['/usr/lib/x86_64-linux-gnu/libfabric.so.1', '/usr/lib64/libfabric.so.1', '/usr/lib/libfabric.so.1'].some((p) =>
  fs.existsSync(p),
);

/**
 * The environment of a driver run: the caller's, without what selects the transport or its
 * devices (each suite sets those itself; default device discovery otherwise), with no warm-up
 * at init (TSNET_WARMUP=0: each driver process would spend up to a second on it; the suites
 * that test it set it), plus env.
 */
export function driverEnv(env: Record<string, string>): NodeJS.ProcessEnv {
  const base = { ...process.env };
  for (const k of ['TSNET_TRANSPORT', 'TSNET_LOOPBACK_DEVICES', 'TSNET_DEVICE_GROUPS', 'NCCL_SOCKET_IFNAME', 'NCCL_SOCKET_FAMILY', 'FI_PROVIDER'])
    delete base[k];
  return { ...base, TSNET_WARMUP: '0', ...env };
}

