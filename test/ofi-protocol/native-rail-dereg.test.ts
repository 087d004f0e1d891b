// NativeRail's deregistrations over a fake binding: a registration with operations in flight
// is not waited for (the engine waits DEREG_WAIT_MS at most, then answers how many are left);
// it is asked again at every tick, one WARN line names those still waiting after the timeout,
// and closing the endpoint (which ends every operation) lets them all go.
import { describe, expect, it } from 'vitest';
import { captureWarnings } from '../support/log-capture';
import type { Port } from '../../plugin/engine/port';
import { DEREG_WAIT_MS, NativeRail, type OfiBinding } from '../../plugin/transports/ofi/native-rail';
import { nicInfo } from './nic-info';

const warns = captureWarnings();

/** A fake engine whose registrations have inflight[mr] operations in flight; ioClose ends them all. */
function rail() {
  const inflight = new Map<number, number>();
  const asked: { mr: number; waitMs: number | undefined }[] = [];
  const gone: number[] = [];
  let next = 1;
  const binding = {
    ofiRail: () => ({ lane: 1, thread: 0, name: new Uint8Array(16) }),
    ofiRegMr: () => ({ mr: next++, key: 0n, keyLo: 0, keyHi: 0, remoteBase: 0 }),
    ofiDeregMr: (mr: number, waitMs?: number) => {
      asked.push({ mr, waitMs });
      const n = inflight.get(mr) ?? 0;
      if (n === 0) gone.push(mr);
      return n;
    },
    ioClose: () => {
      inflight.clear();
      return { partial: false, hard: true };
    },
  } as unknown as OfiBinding;
  const port = { addLink: () => 1, removeLink: () => {}, flush: () => {} } as unknown as Port;
  const r = new NativeRail(port, binding, 0, nicInfo(), 0, () => {});
  return { r, inflight, asked, gone };
}

describe('NativeRail deregistrations with operations in flight', () => {
  it('none in flight: deregistered at once', () => {
    const { r, asked, gone } = rail();
    const reg = r.regMr(4096, 100, 'host');
    r.deregMr(reg);
    expect(gone).toEqual([reg.desc]);
    expect(asked[0].waitMs).toBe(DEREG_WAIT_MS);
    expect(r.deregsPending).toBe(0);
  });

  it('some in flight: the call returns after a short wait; later ticks let it go once they end', () => {
    const { r, inflight, asked, gone } = rail();
    const reg = r.regMr(4096, 100, 'host');
    inflight.set(reg.desc, 2);
    r.deregMr(reg);
    expect(asked).toEqual([{ mr: reg.desc, waitMs: DEREG_WAIT_MS }]);
    expect(DEREG_WAIT_MS).toBeLessThanOrEqual(10);
    expect(r.deregsPending).toBe(1);
    r.retryDeregs(performance.now(), 10_000);
    expect(r.deregsPending).toBe(1);
    expect(asked.at(-1)!.waitMs).toBe(0); // a tick never waits
    inflight.set(reg.desc, 0);
    r.retryDeregs(performance.now(), 10_000);
    expect(r.deregsPending).toBe(0);
    expect(gone).toEqual([reg.desc]);
    expect(warns).toEqual([]);
  });

  it('still in flight after the timeout: one WARN line for all of them, once; closing the endpoint lets them go', () => {
    const { r, inflight, gone } = rail();
    const regs = [r.regMr(4096, 100, 'host'), r.regMr(8192, 100, 'host'), r.regMr(16384, 100, 'host')];
    for (const g of regs) inflight.set(g.desc, 1);
    for (const g of regs) r.deregMr(g);
    const t = performance.now();
    r.retryDeregs(t + 5_000, 10_000);
    expect(warns).toEqual([]);
    r.retryDeregs(t + 11_000, 10_000);
    expect(warns).toHaveLength(1);
    expect(warns[0]).toMatch(/rail 0: 3 deregistered registration\(s\) still have 3 operation\(s\) in flight after 10\.0 s .* until the endpoint closes \(3 waiting in all\)/);
    r.retryDeregs(t + 12_000, 10_000);
    expect(warns).toHaveLength(1);
    r.close();
    expect(r.deregsPending).toBe(0);
    expect(gone.sort()).toEqual(regs.map((g) => g.desc).sort());
    expect(warns).toHaveLength(1);
  });
});
