// TSNET_TRACE (plugin/trace.ts): on which track a request's steps are drawn.
import { describe, expect, it } from 'vitest';
import { Op } from '../../plugin/native';
import { Tracer } from '../../plugin/trace';

function events(text: string[]): { ph: string; name?: string; tid: number; ts?: number; args?: { name?: string } }[] {
  return JSON.parse(`[${text.join(',\n')}]`);
}

describe('Tracer', () => {
  it('draws an I/O thread\'s step on that thread\'s named track, and a step of io -1 (a frame the protocol thread wrote itself) on the protocol thread\'s', () => {
    const out: string[] = [];
    const t = new Tracer({ traceWrite: (s) => out.push(s), now: () => 500 }, 2);
    t.begin(9, 4, Op.SEND, 8, 100, 101);
    t.step(9, 4, 'written', 105, 3);
    t.step(9, 4, 'written here', 106, -1);
    t.end(9, 4, 0);
    t.flush();
    const ev = events(out);
    expect(ev.filter((e) => e.ph === 'M').map((e) => [e.tid, e.args?.name])).toEqual([
      [1002, 'tsnet-proto2'],
      [2003, 'tsnet-io3'],
    ]);
    expect(ev.filter((e) => e.ph === 'n').map((e) => [e.name, e.tid, e.ts])).toEqual([
      ['picked up', 1002, 101],
      ['written', 2003, 105],
      ['written here', 1002, 106],
    ]);
  });
});
