// The plugin's protocol thread stops while comms are open: the driver's `stopped` scenario with
// TSNET_JS_ENTRY naming a wrapper of the built plugin that calls process.exit() once a file
// appears (the host process must live on: docs/threads-and-calls.md). Control calls failed
// already; isend and irecv used to hand requests to the stopped thread and test() answered
// "not done" forever. Over TCP and, with libfabric, over shm.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { afterAll, describe, expect, it } from 'vitest';
import { runAsync } from '../support/spawn';
import { HAVE_LIBFABRIC, LIB, ROOT, buildDriver, driverEnv, requireLib } from './build-driver';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-stopped-'));
const entry = path.join(dir, 'exit-on-file.js');
fs.writeFileSync(
  entry,
  `require(${JSON.stringify(path.join(ROOT, 'dist/plugin/index.js'))});\n` +
    "const fs = require('fs');\n" +
    'const t = setInterval(() => { if (fs.existsSync(process.env.TSNET_TEST_EXIT_FILE)) { clearInterval(t); process.exit(7); } }, 5);\n',
);
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const TRANSPORTS: [string, Record<string, string>][] = [['tcp', { TSNET_TRANSPORT: 'tcp' }]];
if (HAVE_LIBFABRIC) TRANSPORTS.push(['libfabric shm', { TSNET_TRANSPORT: 'ofi', FI_PROVIDER: 'shm' }]);

describe('the plugin\'s thread stops with comms open: every later call fails at once', () => {
  for (const [name, env] of TRANSPORTS)
    it(name, async () => {
      requireLib();
      const file = path.join(dir, `go-${name.replace(/\W/g, '')}`);
      const r = await runAsync(buildDriver(), ['stopped', '--version', '12', '--timeout', '10', '--lib', LIB], {
        cwd: ROOT,
        env: driverEnv({ ...env, TSNET_PROTOCOL_THREADS: '1', TSNET_JS_ENTRY: entry, TSNET_TEST_EXIT_FILE: file }),
        timeout: 60_000,
      });
      const all = r.stdout + r.stderr;
      expect(r.stdout.split('\n').filter((l) => l.startsWith('not ok')), all.slice(-3000)).toEqual([]);
      expect(r.status).toBe(0);
      expect(all).toMatch(/NET\/tsnet the plugin called process\.exit\(7\) on protocol thread 0; it stops/);
      for (const call of ['isend', 'irecv', 'test'])
        expect(all).toMatch(new RegExp(`NET/tsnet ${call}: protocol thread 0 has stopped`));
      expect(all).toMatch(/the plugin is not running: the plugin exited/);
      expect(r.stdout).toMatch(/^ok - v12 stopped: test\(\) of the receive posted before the stop fails \(rc 3/m);
      expect(r.stdout).toMatch(/^ok - v12 stopped: each call returned at once/m);
    }, 90_000);
});
