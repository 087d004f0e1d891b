// deregMr with requests in flight on the memory (OfiTransport's comms, over the fake fabric):
// the requests first get to end, for as long as the comm's requests keep ending, so that writes
// the peer had already posted land while the memory is still registered (shm drops a write whose
// target registration is gone and never completes it: docs/ofi-facts.md). A request that
// cannot end fails the comm once DRAIN_MS pass with none of its requests ending.
import { describe, expect, it } from 'vitest';
import { captureWarnings } from '../support/log-capture';
import type { Region } from '../../plugin/memory';
import type { RecvArgs } from '../../plugin/protocol/receiver';
import type { CommHooks } from '../../plugin/transports/transport';
import { DRAIN_MS, Wrapped, WrappedRecv, WrappedSend } from '../../plugin/transports/ofi/transport';
import { type Side, World, pattern } from './harness';

const warns = captureWarnings();

const hooks = (side: Side, name: string): CommHooks => ({ complete: side.complete, name });

/** A comm pair wrapped as the plugin sees it; pump runs the fake fabric a while (one round of a turn). */
function pair(w: World, pump: () => void) {
  const listener = w.b.ep.listen();
  const connector = w.a.ep.connect(listener.handle);
  let s: WrappedSend | undefined;
  let r: WrappedRecv | undefined;
  w.run(() => {
    if (!s) {
      const c = connector.poll(Wrapped.complete(() => s, hooks(w.a, 'send')));
      if (c) s = new WrappedSend(c, 'test-send', pump);
    }
    if (!r) {
      const c = listener.accept(Wrapped.complete(() => r, hooks(w.b, 'recv')));
      if (c) r = new WrappedRecv(c, 'test-recv', pump);
    }
    return !!s && !!r;
  }, 'connect');
  listener.close();
  return { s: s!, r: r! };
}

const one = (region: Region, offset: number, size: number, tag: number): RecvArgs => ({ n: 1, regions: [region], offsets: [offset], sizes: [size], tags: [tag] });
const steps = (w: World, n: number) => () => {
  for (let i = 0; i < n && w.fabric.step(); i++);
};

describe('deregMr with requests in flight (ofi)', () => {
  it("the receiver's memory: the message on its way lands, the receive completes and the comm lives", () => {
    const w = new World();
    const { s, r } = pair(w, steps(w, 200));
    const src = w.a.region(1 << 20);
    src.bytes!.set(pattern(3, 1 << 20));
    const dst = w.b.region(1 << 20);
    r.irecv(1, one(dst, 0, 1 << 20, 0));
    s.isend(1, src, 0, 1 << 20, 0);
    // Nothing has moved yet: the control message and the write happen inside the drain.
    expect(w.b.has(1)).toBe(false);
    expect(r.cancelRegion(dst)).toBe(0);
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [1 << 20] });
    expect(Buffer.from(dst.bytes!.subarray(0, 1 << 20)).equals(src.bytes!.subarray(0, 1 << 20))).toBe(true);
    expect(warns).toEqual([]);
    // The comm goes on.
    r.irecv(2, one(dst, 0, 100, 0));
    s.isend(2, src, 0, 100, 0);
    w.run(() => w.a.has(1, 2) && w.b.has(2));
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [100] });
  });

  it("the sender's memory: its write finishes into the receive posted for it", () => {
    const w = new World();
    const { s, r } = pair(w, steps(w, 200));
    const src = w.a.region(1 << 20);
    const dst = w.b.region(1 << 20);
    r.irecv(1, one(dst, 0, 300000, 0));
    s.isend(1, src, 0, 300000, 0);
    expect(s.cancelRegion(src)).toBe(0);
    expect(w.a.take(1)).toEqual({ code: 0, sizes: [300000] });
    expect(warns).toEqual([]);
  });

  it('a receive no send will match: the comm fails once DRAIN_MS pass with nothing ending', () => {
    const w = new World();
    const { r } = pair(w, steps(w, 200));
    const dst = w.b.region(4096);
    r.irecv(1, one(dst, 0, 4096, 0));
    r.irecv(2, one(dst, 0, 4096, 1));
    const t0 = performance.now();
    expect(r.cancelRegion(dst)).toBe(2); // both requests fail
    expect(performance.now() - t0).toBeGreaterThanOrEqual(DRAIN_MS - 1);
    expect(w.b.take(1).code).toBe(5); // ncclInvalidUsage
    expect(w.b.take(2).code).toBe(5);
    expect(warns.join('\n')).toMatch(/test-recv: the memory of a request in flight was deregistered; failing 2 pending request\(s\)/);
  });

  it('requests that keep ending keep the drain going past DRAIN_MS', () => {
    const w = new World();
    const src = w.a.region(1 << 16);
    const dst = w.b.region(1 << 16);
    const count = 8;
    let sent = 0;
    let next = 0;
    let s: WrappedSend | undefined;
    // One send every DRAIN_MS / 5 of real time: the last one goes well after DRAIN_MS.
    const pump = () => {
      if (s && sent < count && performance.now() >= next) {
        s.isend(1 + sent, src, 0, 1000, sent);
        sent++;
        next = performance.now() + DRAIN_MS / 5;
      }
      for (let i = 0; i < 500 && w.fabric.step(); i++);
    };
    const p = pair(w, pump);
    s = p.s;
    for (let k = 0; k < count; k++) p.r.irecv(1 + k, one(dst, k * 1000, 1000, k));
    const t0 = performance.now();
    expect(p.r.cancelRegion(dst)).toBe(0);
    expect(performance.now() - t0).toBeGreaterThan(DRAIN_MS);
    for (let k = 0; k < count; k++) expect(w.b.take(1 + k)).toEqual({ code: 0, sizes: [1000] });
    expect(warns).toEqual([]);
  });
});
