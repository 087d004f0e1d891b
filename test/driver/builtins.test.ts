// Without libnode's builtins (the files the bundle's install.sh puts under /usr/share/nodejs)
// libnode aborts the process when Node starts; the host checks them first, so init fails with
// a WARN naming the missing file and the host process lives on. Hides /usr/share/nodejs behind
// an empty directory in a private mount namespace (`unshare -m`): needs root, skipped otherwise.
import * as fs from 'fs';
import { tmpdir } from 'os';
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { LIB, ROOT, buildDriver, requireLib } from './build-driver';

function why(): string | undefined {
  if (process.platform !== 'linux') return 'mount namespaces are Linux only';
  if (process.getuid?.() !== 0) return 'needs root for a private mount namespace';
  if (!fs.existsSync('/usr/share/nodejs')) return 'no /usr/share/nodejs to hide';
  return undefined;
}

const skipReason = why();
if (skipReason) console.log(`skipping the builtins suite: ${skipReason}`);

describe.skipIf(skipReason !== undefined)('libnode builtins missing', () => {
  it('init fails with a WARN naming the missing builtin; the process is not aborted', async () => {
    requireLib();
    const empty = fs.mkdtempSync(path.join(tmpdir(), 'tsnet-no-builtins-'));
    try {
      const script = 'mount --bind "$EMPTY" /usr/share/nodejs || exit 77; exec "$DRIVER" tables --version 12 --lib "$LIB"';
      const r = await runAsync('unshare', ['-m', 'bash', '-c', script], {
        cwd: ROOT,
        env: { ...process.env, EMPTY: empty, DRIVER: buildDriver(), LIB, TSNET_TRANSPORT: 'loopback' },
        timeout: 120_000,
      });
      // 77, or unshare refused: this container cannot make a mount namespace.
      if (r.status === 77 || /unshare failed/.test(r.stderr)) return console.log(`skipped: ${r.stderr.trim()}`);
      expect(r.stdout).not.toMatch(/died of signal/);
      expect(r.stdout).toMatch(/^not ok - v12 tables: init \(rc 3\)$/m);
      expect(r.stderr).toMatch(/NET\/tsnet libnode's builtin \/usr\/share\/nodejs\/\S+ is missing: Node cannot start without it/);
      expect(r.stderr).not.toMatch(/Cannot load externalized builtin/);
      expect(r.signal).toBeNull();
    } finally {
      fs.rmSync(empty, { recursive: true, force: true });
    }
  }, 120_000);
});
