// The shared endpoint: what it refuses, how it hands out comm ids, one listener for many
// connects, completions for tokens it never issued, and the accounting check itself.
import { describe, expect, it } from 'vitest';
import { OFI_DEFAULTS } from '../../plugin/transports/ofi/config';
import { OfiEndpoint } from '../../plugin/transports/ofi/endpoint';
import { CqFlag } from '../../plugin/transports/ofi/fabric';
import { setLogSink } from '../../plugin/log';
import { FakeFabric } from './fake-fabric';
import { World, buf, expectBytes } from './harness';

describe('OfiEndpoint', () => {
  it('refuses a provider with less than 4 bytes of immediate data', () => {
    const f = new FakeFabric({ cqDataBytes: 2 });
    expect(() => new OfiEndpoint(f.host('a', 1).rails, { config: OFI_DEFAULTS })).toThrow(/carries 2 bytes of immediate data; tsnet needs 4/);
  });

  it('posts the bounce window on every rail at once: the endpoint posted-eager count spread over rails', () => {
    const f = new FakeFabric();
    const h = f.host('a', 3);
    const ep = new OfiEndpoint(h.rails, { config: { ...OFI_DEFAULTS, bouncePosted: 64 } });
    expect(h.rails.map((r) => r.posted.length)).toEqual([22, 22, 22]);
    expect(ep.check()).toBeUndefined();
  });

  it('one listener accepts many connects (reuse of a listen comm)', () => {
    const w = new World();
    const l = w.b.ep.listen();
    const cs = [0, 1, 2].map(() => w.a.ep.connect(l.handle));
    const sends = cs.map(() => undefined as unknown);
    const recvs: unknown[] = [];
    w.run(() => {
      cs.forEach((c, i) => (sends[i] ??= c.poll(w.a.complete)));
      const r = l.accept(w.b.complete);
      if (r) recvs.push(r);
      return recvs.length === 3 && sends.every(Boolean);
    });
    expect(new Set(recvs).size).toBe(3);
  });

  it('hands out comm ids round-robin, not the one just closed', () => {
    const w = new World({ maxComms: 4 });
    const p1 = w.connect();
    const p2 = w.connect();
    p1.send.close();
    const p3 = w.connect();
    const ids = [p1, p2, p3].map((p) => (p.send as unknown as { id: number }).id);
    expect(ids).toEqual([1, 2, 3]);
  });

  it('ignores a completion for a token it never issued, with a WARN', () => {
    const warns: string[] = [];
    setLogSink((lvl, _f, m) => lvl === 2 && warns.push(m));
    const w = new World();
    const r = w.a.host.rails[0];
    w.a.ep.onCompletions(r, [{ token: 4242, status: 0, flags: CqFlag.WRITE, len: 0, imm: 0 }]);
    expect(warns.join()).toMatch(/token 4242, which names no operation in flight/);
    setLogSink(() => {});
  });

  it('the accounting check catches a receive posted behind its back and a lost one', () => {
    const w = new World();
    w.check();
    const pool = w.b.ep.pool;
    pool.accounts[0].posted--;
    expect(w.b.ep.check()).toMatch(/receives posted, the window is/);
    pool.accounts[0].posted++;
    pool.accounts[0].reposted++;
    expect(w.b.ep.check()).toMatch(/posted at start \+ \d+ reposted - \d+ consumed/);
    pool.accounts[0].reposted--;
    w.b.host.rails[0].posted.pop();
    expect(() => w.b.check()).toThrow(/receives posted and 0 completed unread at the NIC; the pool counts/);
  });

  it('a send comm and its receive comm on the same endpoint (two ranks on one thread)', () => {
    const w = new World({ nicsA: 2 });
    const { send, recv } = w.connect(w.a, w.a);
    const src = w.a.region(1 << 20);
    const dst = w.a.region(1 << 20);
    for (let i = 0; i < 1 << 20; i++) src.bytes![i] = i * 7;
    recv.irecv(1, [buf(dst, 0, 1 << 20, 0), buf(dst, 512 * 1024, 100, 1)]);
    send.isend(2, buf(src, 512 * 1024, 100, 1));
    send.isend(3, buf(src, 0, 300000, 0));
    w.run(() => w.a.has(1, 2, 3));
    expect(w.a.take(1)).toEqual({ code: 0, sizes: [300000, 100] });
    expectBytes(dst.bytes!, 0, src.bytes!.subarray(0, 300000));
  });

  it('freeMemory, after close and the rails, deregisters everything the endpoint registered itself', () => {
    const f = new FakeFabric();
    const h = f.host('a', 2);
    const ep = new OfiEndpoint(h.rails, { config: OFI_DEFAULTS });
    expect(h.rails.map((r) => r.regs.size > 0)).toEqual([true, true]); // bounce chunks, the flush line
    ep.close();
    ep.freeMemory();
    ep.freeMemory(); // once only
    expect(h.rails.map((r) => r.regs.size)).toEqual([0, 0]);
  });

  it("freeMemory also frees the closed comms' regions still in quarantine", () => {
    const w = new World();
    const { send, recv } = w.connect();
    const src = w.a.region(64);
    const dst = w.b.region(64);
    const own = (s: typeof w.a) => s.host.rails.map((r) => r.regs.size);
    const before = [own(w.a), own(w.b)];
    recv.irecv(1, [buf(dst, 0, 64, 0)]);
    send.isend(2, buf(src, 0, 64, 0));
    w.run(() => w.b.has(1) && w.a.has(2));
    send.close();
    recv.close();
    for (const s of [w.a, w.b]) {
      s.ep.close();
      s.ep.freeMemory();
    }
    // what is left is the test's own regions (one registration per rail each)
    expect([own(w.a), own(w.b)].every((x) => x.every((n) => n === 1))).toBe(true);
    expect(before.flat().every((n) => n > 1)).toBe(true);
  });

  it('a comm of a closed endpoint posts nothing more', () => {
    const w = new World();
    const { send, recv } = w.connect();
    const dst = w.b.region(64);
    recv.irecv(1, [buf(dst, 0, 64, 0)]);
    w.b.ep.close();
    expect(w.b.done.size).toBe(0);
    expect(() => w.b.ep.check()).not.toThrow();
    void send;
  });
});
