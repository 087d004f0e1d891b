// TSNET_TRACE over libfabric: a comm's requests get steps timed by the I/O thread's
// completions (the fake stamps each completion with the step count and its rail): a send is
// 'sent' (eager) or 'written' when its last operation completed and, with CUDA IPC,
// 'acknowledged'; a receive is 'landed' when its last part arrived and, with CUDA IPC,
// 'fenced' when its fence round completed.
import { describe, expect, it } from 'vitest';
import type { StepTrace } from '../../plugin/transports/ofi/fabric';
import { World, type WorldOptions, buf, expectBytes, pattern } from './harness';

interface Step {
  slot: number;
  what: string;
  us: number;
  io: number;
}

function recorder(): StepTrace & { steps: Step[] } {
  const steps: Step[] = [];
  return { steps, step: (slot, what, us, io) => steps.push({ slot, what, us, io }) };
}

function traced(opts: WorldOptions = {}) {
  const w = new World({ seed: 3, ...opts, fake: { times: true, ...opts.fake } });
  const { send, recv } = w.connect();
  const st = recorder();
  const rt = recorder();
  send.trace = st;
  recv.trace = rt;
  return { w, send, recv, st, rt };
}

describe('TSNET_TRACE steps over libfabric', () => {
  it('an eager send is sent, its receive landed, each timed by a completion', () => {
    const { w, send, recv, st, rt } = traced();
    const src = w.a.region(4096);
    const dst = w.b.region(4096);
    const data = pattern(1, 100);
    w.fabric.bytesOf(src).set(data);
    send.isend(5, buf(src, 0, 100, 1));
    recv.irecv(6, [buf(dst, 0, 4096, 1)]);
    w.run(() => w.a.has(5) && w.b.has(6));
    expectBytes(w.fabric.bytesOf(dst), 0, data);
    expect(st.steps.map((s) => [s.slot, s.what])).toEqual([[5, 'sent']]);
    expect(rt.steps.map((s) => [s.slot, s.what])).toEqual([[6, 'landed']]);
    for (const s of [...st.steps, ...rt.steps]) {
      expect(s.us).toBeGreaterThan(0);
      expect(s.us).toBeLessThanOrEqual(w.fabric.steps);
      expect(s.io).toBe(0);
    }
  });

  it('a written send striped over two NICs gives one written step', () => {
    const { w, send, recv, st, rt } = traced({ nicsA: 2 });
    const size = 1 << 20;
    const src = w.a.region(size);
    const dst = w.b.region(size);
    send.isend(1, buf(src, 0, size, 2));
    recv.irecv(2, [buf(dst, 0, size, 2)]);
    w.run(() => w.a.has(1) && w.b.has(2));
    expect(st.steps.map((s) => s.what)).toEqual(['written']);
    expect(rt.steps.map((s) => s.what)).toEqual(['landed']);
    expect(w.a.host.rails.map((r) => r.log.filter((o) => o.type === 'write' && o.len > 0).length)).toEqual([1, 1]); // one stripe per NIC
  });

  it('CUDA IPC: the send is written, then acknowledged; the receive landed, then fenced', () => {
    const { w, send, recv, st, rt } = traced({ config: { gpuIpc: true } });
    const src = w.a.region(65536, 'cuda', true);
    const dst = w.b.region(65536, 'cuda', true);
    send.isend(1, buf(src, 0, 40000, 3));
    recv.irecv(2, [buf(dst, 0, 65536, 3)]);
    w.run(() => w.a.has(1) && w.b.has(2));
    expect(st.steps.map((s) => s.what)).toEqual(['written', 'acknowledged']);
    expect(rt.steps.map((s) => s.what)).toEqual(['landed', 'fenced']);
    expect(st.steps[1].us).toBeGreaterThanOrEqual(st.steps[0].us);
    expect(rt.steps[1].us).toBeGreaterThanOrEqual(rt.steps[0].us);
    expect(st.steps[1].us).toBeGreaterThanOrEqual(rt.steps[1].us); // acknowledged after fenced
  });
});
