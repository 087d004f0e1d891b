// recordCrash (test/support/spawn.ts): what a test program that faulted said about it is kept for
// the end of `npm test`'s output; programs that did not fault leave nothing. recordShmLeft: the
// libfabric shm regions an ended program left in /dev/shm are removed and noted.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { type Ran, recordCrash, recordShmLeft } from '../support/spawn';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-crash-'));
const file = path.join(dir, 'crash-reports.log');
const ran = (o: Partial<Ran>): Ran => ({ status: 0, signal: null, stdout: '', stderr: '', seconds: 0, ...o });
const read = () => (fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '');

afterEach(() => fs.rmSync(file, { force: true }));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('recordCrash', () => {
  it('keeps the driver\'s report of a role that faulted: the parent\'s line and the native stack', () => {
    const stack = Array.from({ length: 50 }, (_, i) => `frame ${i}`);
    const stderr = ['log line', 'CRASH: pid 42 thread tsnet-io0: signal 11 at address 0x8; native stack:', ...stack].join('\n');
    const stdout = 'ok - v9 transfer [recv]: deregMr (rc 0)\nnot ok - v9 transfer: the receiver process died of signal 11\n';
    recordCrash('/x/build/test/driver', ['all', '--procs', '2'], ran({ status: 1, stdout, stderr }), file);
    const got = read();
    expect(got).toMatch(/^--- driver all --procs 2: status 1, signal none$/m);
    expect(got).toMatch(/^not ok - v9 transfer: the receiver process died of signal 11$/m);
    expect(got).toMatch(/^CRASH: pid 42 thread tsnet-io0: signal 11/m);
    expect(got).toContain('frame 38\n');
    expect(got).not.toContain('frame 39'); // 40 lines from the CRASH line on
    expect(got).not.toContain('log line');
  });

  it('notes a program killed by a fault signal even when it printed nothing', () => {
    recordCrash('/bin/prog', [], ran({ status: null, signal: 'SIGSEGV' }), file);
    expect(read()).toBe('--- prog : status null, signal SIGSEGV\n(the process printed no crash report)\n');
  });

  it('appends one block per program', () => {
    recordCrash('a', [], ran({ signal: 'SIGBUS', status: null }), file);
    recordCrash('b', [], ran({ signal: 'SIGABRT', status: null }), file);
    expect(read().match(/^--- /gm)?.length).toBe(2);
  });

  it('leaves nothing for clean runs, failed checks and SIGKILL (killpeer kills on purpose)', () => {
    recordCrash('d', [], ran({ stdout: '10 passed, 0 failed\n' }), file);
    recordCrash('d', [], ran({ status: 1, stdout: 'not ok - v12 x: connect returned 3\n' }), file);
    recordCrash('d', [], ran({ status: 0, stdout: 'ok - v12 killpeer: the sender died of signal 9\n' }), file);
    recordCrash('d', [], ran({ status: null, signal: 'SIGKILL' }), file);
    expect(read()).toBe('');
  });
});

describe('recordShmLeft', () => {
  it('removes the regions named for the ended program\'s pid and notes them with the command; others stay', () => {
    const shm = fs.mkdtempSync(path.join(dir, 'shm-'));
    const log = path.join(dir, 'shm-left.log');
    for (const f of ['4242:0:0', '4242:0:1', '42420:0:0', '424:0:0', 'tsnet-bell-00ff']) fs.writeFileSync(path.join(shm, f), 'x');
    expect(recordShmLeft('/x/build/test/driver', ['exitbusy', '--version', '12'], 4242, log, shm).sort()).toEqual(['4242:0:0', '4242:0:1']);
    expect(fs.readdirSync(shm).sort()).toEqual(['42420:0:0', '424:0:0', 'tsnet-bell-00ff']);
    expect(fs.readFileSync(log, 'utf8')).toBe(`driver exitbusy --version 12 (pid 4242): ${shm}/4242:0:0, ${shm}/4242:0:1\n`);
    expect(recordShmLeft('prog', [], 77, log, shm)).toEqual([]); // nothing of its own: no line
    expect(recordShmLeft('prog', [], undefined, log, shm)).toEqual([]); // never started
    expect(fs.readFileSync(log, 'utf8').split('\n').filter(Boolean)).toHaveLength(1);
  });
});
