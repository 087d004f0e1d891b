// scripts/check-build.sh, the first step of `npm run build`, against fake checkouts in a temp
// dir: with something setup provides missing it stops with exit 1 and exactly one line on
// stderr naming the missing piece and `npm run setup`; with everything there it says nothing.
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { tmpdir } from 'node:os';
import { afterAll, describe, expect, it } from 'vitest';

const SCRIPT = path.resolve(__dirname, '../../scripts/check-build.sh');
const roots: string[] = [];
afterAll(() => roots.forEach((r) => fs.rmSync(r, { recursive: true, force: true })));

function touch(...parts: string[]): void {
  const p = path.join(...parts);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, '');
}

/** A checkout: npm packages unless told not to, and a libnode prefix (relative to the checkout) holding `files`. */
function checkout(o: { npm?: boolean; prefix?: string; files?: string[] } = {}): string {
  const root = fs.mkdtempSync(path.join(tmpdir(), 'tsnet-checkbuild-'));
  roots.push(root);
  if (o.npm ?? true)
    for (const f of ['node_modules/.bin/tsc', 'node_modules/.bin/cmake-js', 'node_modules/node-addon-api/napi.h']) touch(root, f);
  if (o.prefix !== undefined) {
    fs.mkdirSync(path.join(root, '.deps'), { recursive: true });
    fs.writeFileSync(path.join(root, '.deps/libnode-prefix'), `${path.join(root, o.prefix)}\n`);
    fs.mkdirSync(path.join(root, o.prefix), { recursive: true });
    for (const f of o.files ?? []) touch(root, o.prefix, f);
  }
  return root;
}

function check(root: string) {
  const r = spawnSync('bash', [SCRIPT, root], { encoding: 'utf8' });
  return { status: r.status, out: r.stdout, lines: r.stderr.split('\n').filter(Boolean) };
}

/** Exit 1, nothing on stdout, one stderr line starting with `build: `, containing `what`, ending with the command. */
function expectStop(root: string, what: RegExp): string {
  const r = check(root);
  expect(r.status).toBe(1);
  expect(r.out).toBe('');
  expect(r.lines).toHaveLength(1);
  expect(r.lines[0]).toMatch(/^build: .*; run npm run setup first$/);
  expect(r.lines[0]).toMatch(what);
  return r.lines[0];
}

const HEADERS = ['include/node/node.h', 'include/uv.h'];
const LIBS = ['lib/x86_64-linux-gnu/libnode.so', 'lib/x86_64-linux-gnu/libuv.so'];

describe('scripts/check-build.sh', () => {
  it('an empty directory (a fresh clone before npm ci): the npm packages are missing', () => {
    expectStop(checkout({ npm: false }), /the npm packages are missing \(no node_modules\/\.bin\/tsc\)/);
  });

  it('node-addon-api missing is named', () => {
    const root = checkout({ prefix: 'p', files: [...HEADERS, ...LIBS] });
    fs.rmSync(path.join(root, 'node_modules/node-addon-api'), { recursive: true });
    expectStop(root, /no node_modules\/node-addon-api\/napi\.h/);
  });

  it('a prefix without libnode headers: names the headers, the directory and where the prefix came from', () => {
    const root = checkout({ prefix: 'empty' });
    const line = expectStop(root, /^build: libnode's headers are missing/);
    expect(line).toContain(`no node.h in ${path.join(root, 'empty')}/include/node`);
    expect(line).toContain('prefix from .deps/libnode-prefix');
  });

  it('a stale .deps/libnode-prefix (its directory removed) stops the same way', () => {
    const root = checkout({ prefix: 'gone', files: [...HEADERS, ...LIBS] });
    fs.rmSync(path.join(root, 'gone'), { recursive: true });
    expectStop(root, /^build: libnode's headers are missing/);
  });

  it.skipIf(fs.existsSync('/usr/include/uv.h'))('headers without uv.h: names uv.h', () => {
    expectStop(checkout({ prefix: 'p', files: ['include/node/node.h', ...LIBS] }), /^build: libuv's header is missing \(no uv\.h in /);
  });

  it('headers without the library: names libnode.so', () => {
    expectStop(checkout({ prefix: 'p', files: [...HEADERS, 'lib/x86_64-linux-gnu/libuv.so'] }), /^build: libnode is missing \(no libnode\.so in /);
  });

  it('everything setup provides: exit 0, silent', () => {
    for (const files of [[...HEADERS, ...LIBS], [...HEADERS, 'lib/libnode.so', 'lib/x86_64-linux-gnu/libuv.so.1']]) {
      const r = check(checkout({ prefix: 'p', files }));
      expect(r).toEqual({ status: 0, out: '', lines: [] });
    }
  });
});
