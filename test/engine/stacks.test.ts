// TSNET_STALL_STACKS (native/stacks.h): every thread's stack of the process into a file, with
// the real engine in a child process (the variable is read when the I/O threads start): with
// it, tsnet's I/O threads answer, one of them inside a (test) stall, asleep in libc; without
// it, they block the signal and the dump says so instead of waiting.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { describe, expect, it } from 'vitest';
import { ADDON, missing } from './helpers';

function dump(env: Record<string, string>, file: string) {
  const script = `
    const a = require(${JSON.stringify(ADDON)});
    a.setThread(0);
    a.ioStart(2, 0, 2000, 50);
    a.ioTestStall(1, 1500);
    setTimeout(() => {
      let bad;
      try { a.dumpStacks('/nonexistent/dir/stacks-%p.txt'); } catch (e) { bad = e.message; }
      console.log(JSON.stringify({ d: a.dumpStacks(${JSON.stringify(file)}), bad, pid: process.pid }));
      process.exit(0);
    }, 300);`;
  const r = spawnSync(process.execPath, ['-e', script], { env: { ...process.env, ...env }, encoding: 'utf8', timeout: 20_000 });
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { d: { threads: number; answered: number; file: string }; bad: string; pid: number };
}

/** The file's sections, one per thread: its name and lines. */
function sections(text: string): { name: string; lines: string[] }[] {
  const out: { name: string; lines: string[] }[] = [];
  for (const line of text.split('\n')) {
    const m = /^--- thread \d+ \((.*)\)$/.exec(line);
    if (m) out.push({ name: m[1], lines: [] });
    else if (out.length && line) out[out.length - 1].lines.push(line);
  }
  return out;
}
const NO_ANSWER = '(no answer in 200 ms: the thread blocks the signal)';
const thread = (s: ReturnType<typeof sections>, name: string) => s.find((t) => t.name === name)?.lines ?? [];

describe.skipIf(!!missing)('TSNET_STALL_STACKS: the stacks of every thread', () => {
  it('with it set, tsnet\'s I/O threads answer too, the stalled one asleep inside its call; the %p is the pid', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-stacks-'));
    const { d, bad, pid } = dump({ TSNET_STALL_STACKS: '1' }, path.join(dir, 'stacks-%p.txt'));
    expect(d.file).toBe(path.join(dir, `stacks-${pid}.txt`));
    expect(bad).toMatch(/^dumpStacks: cannot open \/nonexistent\/dir\/stacks-\d+\.txt: No such file or directory/);
    const text = fs.readFileSync(d.file, 'utf8');
    expect(text).toMatch(new RegExp(`^=== tsnet: the stacks of process ${pid}, ${d.threads} threads`));
    const s = sections(text);
    expect(s).toHaveLength(d.threads);
    expect(d.answered).toBe(s.filter((t) => t.lines[0] !== NO_ANSWER).length);
    for (const io of ['tsnet-io0', 'tsnet-io1']) {
      expect(thread(s, io).length, `${io}: ${thread(s, io).join('\n')}`).toBeGreaterThan(2);
      expect(thread(s, io)).not.toContain(NO_ANSWER);
    }
    // The stalled thread sleeps in libc (usleep: nanosleep) under the engine's thread function.
    expect(thread(s, 'tsnet-io1').join('\n')).toMatch(/usleep\+0x/);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('without it, tsnet\'s I/O threads block the signal: the dump notes it after 200 ms each and goes on', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tsnet-stacks-'));
    const { d } = dump({ TSNET_STALL_STACKS: '' }, path.join(dir, 'stacks.txt'));
    const s = sections(fs.readFileSync(d.file, 'utf8'));
    expect(s).toHaveLength(d.threads);
    for (const io of ['tsnet-io0', 'tsnet-io1']) expect(thread(s, io)).toEqual([NO_ANSWER]);
    expect(d.answered).toBe(s.filter((t) => t.lines[0] !== NO_ANSWER).length);
    expect(d.answered).toBeGreaterThan(0); // Node's own threads, and this one
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
