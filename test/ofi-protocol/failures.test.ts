// Failures: provider errors become NCCL codes with a WARN in the provider's words; a dead peer
// is found (its operations fail, or its heartbeats stop); closing comms with requests in
// flight neither hangs nor lets anything of them reach a later comm with the same id; connect
// refuses stale handles and times out.
import { describe, expect, it } from 'vitest';
import { captureWarnings } from '../support/log-capture';
import type { RecvComm, SendComm } from '../../plugin/transports/ofi/fabric';
import type { OfiSendComm } from '../../plugin/transports/ofi/send-comm';
import { MsgKind, REFUSAL_BYTES, Refusal, encodeRefusal, msgKind } from '../../plugin/transports/ofi/wire';
import { World, buf, pattern } from './harness';

const warns = captureWarnings();

function setup(opts: ConstructorParameters<typeof World>[0] = {}) {
  const w = new World({ timeoutMs: 1000, ...opts });
  const { send, recv } = w.connect();
  const src = w.a.region(1 << 20);
  src.bytes!.set(pattern(1, 1 << 20));
  const dst = w.b.region(1 << 20);
  return { w, send, recv, src, dst };
}

/** One message of size bytes over a comm pair a repeated CONNECT or ACCEPT made; its bytes as received. */
function oneMessage(w: World, send: SendComm, recv: RecvComm, size: number, seed: number): Uint8Array {
  const src = w.a.region(size);
  src.bytes!.set(pattern(seed, size));
  const dst = w.b.region(size);
  recv.irecv(1, [buf(dst, 0, size, 0)]);
  send.isend(1, buf(src, 0, size, 0));
  w.run(() => w.a.has(1) && w.b.has(1));
  expect(w.b.take(1)).toEqual({ code: 0, sizes: [size] });
  return dst.bytes!.subarray(0, size);
}

describe('provider errors', () => {
  it('a failed write fails the send with ncclSystemError and a WARN naming the provider words', () => {
    const { w, send, recv, src, dst } = setup();
    recv.irecv(1, [buf(dst, 0, 1 << 20, 0)]);
    w.settle();
    w.a.host.rails[0].failNext({ type: 'write', status: -5, error: 'fake provider: DMA engine fault' });
    send.isend(1, buf(src, 0, 100000, 0));
    w.run(() => w.a.has(1));
    expect(w.a.take(1)).toEqual({ code: 2, sizes: [0] });
    expect(warns.some((m) => /RDMA write on rail 0 failed: fake provider: DMA engine fault \(EIO\)/.test(m))).toBe(true);
    send.isend(2, buf(src, 0, 10, 0)); // later requests fail at once
    expect(w.a.take(2).code).toBe(2);
    // The receiver hears nothing more (a failed comm sends no heartbeats) and times out.
    for (let t = 0; t < 12; t++) w.advance(125);
    expect(w.b.take(1).code).toBe(6);
    expect(warns.some((m) => /nothing heard from the peer/.test(m))).toBe(true);
  });

  it('a connection reset is a remote error', () => {
    const { w, send, src } = setup();
    w.a.host.rails[0].failNext({ type: 'send', status: -104, error: 'fake provider: connection reset' });
    send.isend(1, buf(src, 0, 100, 0)); // eager
    w.run(() => w.a.has(1));
    expect(w.a.take(1).code).toBe(6);
    expect(warns.join('\n')).toMatch(/eager send on rail 0 failed: fake provider: connection reset \(ECONNRESET\)/);
  });

  it('a write to memory the receiver deregistered fails with the provider words', () => {
    const { w, send, recv, src, dst } = setup();
    recv.irecv(1, [buf(dst, 0, 4096, 0)]);
    w.settle();
    w.b.host.rails[0].deregMr(dst.regs[0]);
    send.isend(1, buf(src, 0, 4096, 0));
    w.run(() => w.a.has(1));
    expect(w.a.take(1).code).toBe(2);
    expect(warns.join('\n')).toMatch(/Remote access error: key 0x[0-9a-f]+ is not registered at the target/);
  });
});

describe('a dead peer', () => {
  it('receiver dies with writes and eager sends in flight: they fail with ECONNRESET', () => {
    const { w, send, recv, src, dst } = setup();
    recv.irecv(1, [buf(dst, 0, 1 << 20, 0)]);
    w.settle();
    w.fabric.kill(w.b.host);
    send.isend(1, buf(src, 0, 100000, 0));
    send.isend(2, buf(src, 0, 100, 1));
    w.run(() => w.a.has(1, 2));
    expect([w.a.take(1).code, w.a.take(2).code]).toEqual([6, 6]);
    expect(warns.join('\n')).toMatch(/reset by peer/);
  });

  it('receiver dies while the sender waits for control messages: the heartbeat finds out', () => {
    const { w, send, src } = setup();
    send.isend(1, buf(src, 0, 100000, 0)); // waits for its control message: nothing in flight
    w.settle();
    w.fabric.kill(w.b.host);
    w.advance(300); // quiet for a quarter of the timeout: heartbeat
    w.run(() => w.a.has(1));
    expect(w.a.take(1).code).toBe(6);
  });

  it('sender dies while receives are posted', () => {
    const { w, recv, dst } = setup();
    recv.irecv(1, [buf(dst, 0, 100, 0)]);
    recv.irecv(2, [buf(dst, 100, 100, 0), buf(dst, 200, 100, 1)]);
    w.settle();
    w.fabric.kill(w.a.host);
    w.advance(300);
    w.run(() => w.b.has(1, 2));
    expect([w.b.take(1), w.b.take(2)]).toEqual([
      { code: 6, sizes: [0] },
      { code: 6, sizes: [0, 0] },
    ]);
  });

  it('a peer that says nothing for the timeout with requests pending is declared dead', () => {
    const { w, recv, dst } = setup();
    recv.irecv(1, [buf(dst, 0, 100, 0)]);
    w.settle();
    // Only b's clock runs: a (frozen) sends no heartbeats; b's heartbeats still reach it.
    for (let t = 0; t < 9; t++) {
      w.now += 125;
      w.b.ep.tick(w.now);
      w.settle();
    }
    expect(w.b.has(1)).toBe(true);
    expect(w.b.take(1).code).toBe(6);
    expect(warns.join('\n')).toMatch(/nothing heard from the peer for 1\.\d s with 1 request\(s\) pending/);
  });

  it('a quiet but live peer is not: heartbeats keep both sides alive for many timeouts', () => {
    const { w, send, recv, dst } = setup();
    recv.irecv(1, [buf(dst, 0, 100, 0)]);
    for (let t = 0; t < 80; t++) {
      w.advance(125);
      w.settle();
    }
    expect(w.b.done.size + w.a.done.size).toBe(0);
    expect(w.a.host.rails[0].log.filter((o) => o.type === 'send' && o.len === 0).length).toBeGreaterThan(20);
    w.check();
    void send;
  });
});

describe('a peer that closes its comm (CLOSE)', () => {
  it('the receiver closes with sends pending: they fail after the grace, not at the timeout, with a WARN that says so', () => {
    const { w, send, recv, src, dst } = setup({ timeoutMs: 4000 }); // grace 1 s
    recv.irecv(1, [buf(dst, 0, 4096, 0)]);
    w.settle();
    w.fabric.hold = (type) => type === 'write'; // the send's data never gets there
    send.isend(1, buf(src, 0, 4096, 0));
    send.isend(2, buf(src, 0, 100, 0)); // waits for a receive that will not come
    w.settle();
    recv.close();
    w.settle();
    expect(w.a.ep.stats.peerClosed).toBe(1);
    w.advance(900);
    expect(w.a.has(1) || w.a.has(2)).toBe(false); // within the grace: what the peer sent may still complete
    w.advance(200);
    w.run(() => w.a.has(1) && w.a.has(2));
    expect([w.a.take(1).code, w.a.take(2).code]).toEqual([6, 6]);
    expect(warns.join('\n')).toMatch(/send comm \d+: the peer closed its comm 1\.1 s ago with requests pending here; failing 2 pending request\(s\)/);
    // A send posted now fails at once: the comm has failed.
    send.isend(3, buf(src, 0, 100, 0));
    w.settle();
    expect(w.a.take(3).code).toBe(6);
    w.fabric.hold = undefined;
    send.close();
    w.settle();
    w.check();
  });

  it('the sender closes with receives pending: they fail after the grace; what it sent before completes', () => {
    const { w, send, recv, src, dst } = setup(); // timeout 1 s: grace 250 ms
    recv.irecv(1, [buf(dst, 0, 4096, 0)]);
    recv.irecv(2, [buf(dst, 4096, 4096, 0)]);
    w.settle();
    send.isend(1, buf(src, 0, 100, 0));
    w.run(() => w.a.has(1) && w.b.has(1));
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [100] });
    send.close();
    w.settle();
    expect(w.b.ep.stats.peerClosed).toBe(1);
    w.advance(200);
    expect(w.b.has(2)).toBe(false);
    w.advance(100);
    w.run(() => w.b.has(2));
    expect(w.b.take(2).code).toBe(6);
    expect(warns.join('\n')).toMatch(/recv comm \d+: the peer closed its comm 0\.3 s ago with requests pending here/);
    recv.close();
    w.settle();
    w.check();
  });

  it('both ends close with nothing pending (NCCL\'s teardown): no WARN, no heartbeat after the CLOSE, no CLOSE back', () => {
    const { w, send, recv } = setup();
    recv.close();
    w.settle();
    const sends = () => w.a.host.rails[0].log.filter((o) => o.type === 'send').length + w.b.host.rails[0].log.filter((o) => o.type === 'send').length;
    const before = sends();
    for (let t = 0; t < 8; t++) w.advance(250); // two timeouts: the send comm neither fails nor beats
    expect(sends()).toBe(before);
    send.close();
    w.settle();
    expect(sends()).toBe(before); // its peer is gone: nothing to tell
    expect(warns).toEqual([]);
    expect(w.a.ep.stats.peerClosed).toBe(1);
    expect(w.b.ep.stats.staleMessages).toBe(0);
    for (const side of [w.a, w.b]) {
      side.check();
      expect(side.ep.ops.inflight).toBe(0);
    }
  });

  it('a late CLOSE for a closed comm does not reach the later comm that took its id', () => {
    const w = new World({ timeoutMs: 1000, maxComms: 2 }); // one comm id per endpoint
    const first = w.connect();
    w.fabric.hold = (type, _len, imm) => type === 'send' && msgKind(imm) === MsgKind.CLOSE;
    first.recv.close();
    first.send.close();
    w.settle();
    w.advance(1001); // quarantine over; both CLOSEs still in flight
    const { send, recv } = w.connect();
    expect([send, recv].map((c) => (c as unknown as { id: number }).id)).toEqual([1, 1]);
    w.fabric.hold = undefined;
    w.settle();
    expect(w.a.ep.stats.peerClosed + w.b.ep.stats.peerClosed).toBe(0);
    expect(w.a.ep.stats.staleMessages + w.b.ep.stats.staleMessages).toBe(2);
    expect(oneMessage(w, send, recv, 1000, 9)).toEqual(pattern(9, 1000));
    for (let t = 0; t < 8; t++) w.advance(250);
    recv.irecv(5, [buf(w.b.region(100), 0, 100, 0)]);
    send.isend(5, buf(w.a.region(100), 0, 100, 0));
    w.run(() => w.a.has(5) && w.b.has(5));
    expect(w.b.take(5)).toEqual({ code: 0, sizes: [100] });
    expect(warns).toEqual([]);
  });
});

describe('close with requests in flight', () => {
  it('closing both ends mid-transfer: no completion afterwards, stale traffic dropped, buffers all back', () => {
    const { w, send, recv, src, dst } = setup({ config: { bouncePosted: 4 } });
    for (let i = 0; i < 8; i++) recv.irecv(i, [buf(dst, i * 65536, 65536, 0)]);
    w.fabric.run(() => w.fabric.ops.length > 3);
    for (let i = 0; i < 8; i++) send.isend(i, buf(src, i * 1000, i % 2 ? 100 : 50000, 0));
    for (let i = 0; i < 20 && w.fabric.step(); i++);
    const aDone = w.a.done.size;
    const bDone = w.b.done.size;
    recv.close();
    send.close();
    w.settle();
    expect(w.a.done.size).toBe(aDone);
    expect(w.b.done.size).toBe(bDone);
    const stale = w.a.ep.stats.staleOps + w.b.ep.stats.staleOps + w.a.ep.stats.staleWrites + w.b.ep.stats.staleWrites + w.b.ep.stats.staleMessages;
    expect(stale).toBeGreaterThan(0);
    for (const s of [w.a, w.b]) {
      s.check();
      for (const a of s.ep.pool.accounts) expect(a.held).toBe(0);
      expect(s.ep.ops.inflight).toBe(0);
    }
    // The endpoints go on: a new pair works.
    const p = w.connect();
    p.recv.irecv(100, [buf(dst, 0, 1000, 5)]);
    p.send.isend(100, buf(src, 0, 1000, 5));
    w.run(() => w.a.has(100) && w.b.has(100));
    expect(w.b.take(100)).toEqual({ code: 0, sizes: [1000] });
  });

  it('a closed comm id is not reused within the quarantine; after it, the new comm sees nothing of the old one', () => {
    const { w, send, recv, src, dst } = setup({ maxComms: 2 }); // one id per endpoint
    recv.irecv(1, [buf(dst, 0, 1 << 20, 0)]);
    w.settle();
    w.fabric.hold = (type, len) => type === 'write' && len === 100000;
    send.isend(1, buf(src, 0, 100000, 0)); // its write is held: in flight
    w.settle();
    send.close();
    expect(() => w.connect()).toThrow(/in use or in quarantine/);
    w.advance(1001);
    w.fabric.hold = undefined;
    // The old write completes now: its token names the closed comm, not the new one with its id.
    const before = w.a.ep.stats.staleOps;
    // The receiver heard nothing from the closed sender for the timeout: its receive failed.
    expect(w.b.take(1)).toEqual({ code: 6, sizes: [0] });
    recv.close();
    w.advance(1001);
    w.settle();
    expect(w.a.ep.stats.staleOps).toBe(before + 1);
    const p = w.connect();
    expect(w.a.done.size + w.b.done.size).toBe(0);
    p.recv.irecv(2, [buf(dst, 0, 100, 7)]);
    p.send.isend(2, buf(src, 0, 100, 7));
    w.run(() => w.a.has(2) && w.b.has(2));
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [100] });
    expect(w.a.take(2)).toEqual({ code: 0, sizes: [100] });
    expect([...w.a.done.keys(), ...w.b.done.keys()]).toEqual([]);
  });

  it('local operations of a closed comm never reach a new comm that took its id', () => {
    const { w, send, recv, src, dst } = setup({ maxComms: 2 });
    recv.irecv(1, [buf(dst, 0, 1 << 20, 0)]);
    w.settle();
    w.fabric.hold = (type, len) => type === 'write' && len === 100000;
    send.isend(1, buf(src, 0, 100000, 0));
    w.settle();
    send.close();
    recv.close();
    w.advance(1001); // quarantine over while the old write is still in flight
    const p = w.connect();
    p.recv.irecv(2, [buf(dst, 0, 200000, 0)]);
    w.settle();
    w.fabric.hold = undefined;
    p.send.isend(2, buf(src, 0, 100000, 0));
    w.run(() => w.a.has(2) && w.b.has(2));
    expect(w.a.take(2)).toEqual({ code: 0, sizes: [100000] });
    expect(w.b.take(2)).toEqual({ code: 0, sizes: [100000] });
    expect(w.a.done.size + w.b.done.size).toBe(0);
    w.settle(); // the old write, wherever the scheduler put it
    expect(w.a.done.size + w.b.done.size).toBe(0);
    expect(w.a.ep.stats.staleOps).toBeGreaterThanOrEqual(1);
  });

  it('a CONNECT whose send fails is sent again: one receive comm, and it carries data', () => {
    const w = new World({ timeoutMs: 1000 });
    const l = w.b.ep.listen();
    w.a.host.rails[0].failNext({ type: 'send', status: -125, error: 'fake provider: connection dropped' });
    const c = w.a.ep.connect(l.handle);
    let send: ReturnType<typeof c.poll>;
    let recv: ReturnType<typeof l.accept>;
    for (let step = 0; step < 20 && !(send && recv); step++) {
      w.settle();
      w.now += 25; // past the retry delay
      send ??= c.poll(w.a.complete);
      recv ??= l.accept(w.b.complete);
    }
    expect(send && recv).toBeTruthy();
    w.settle();
    expect(l.accept(w.b.complete)).toBeUndefined(); // no second comm for the same connector
    expect(oneMessage(w, send!, recv!, 4096, 3)).toEqual(pattern(3, 4096));
    expect(warns).toEqual([]);
  });

  /** A connect whose ACCEPT send fails (status, the provider's words): the receive comm made for it, and the connector still waiting. */
  function lostAccept(status: number, error: string) {
    const w = new World({ timeoutMs: 2000 });
    const l = w.b.ep.listen();
    w.b.host.rails[0].failNext({ type: 'send', status, error });
    const c = w.a.ep.connect(l.handle);
    w.settle();
    expect(c.poll(w.a.complete)).toBeUndefined();
    const recv = l.accept(w.b.complete); // made for the first CONNECT, its ACCEPT lost
    expect(recv).toBeDefined();
    return { w, l, c, recv };
  }

  it('an ACCEPT whose send fails: the connector asks again and the same receive comm answers', () => {
    const { w, l, c, recv } = lostAccept(-125, 'fake provider: connection dropped');
    w.now += 501; // no answer: CONNECT again
    expect(c.poll(w.a.complete)).toBeUndefined();
    w.settle();
    const send = c.poll(w.a.complete);
    expect(send).toBeDefined();
    expect(l.accept(w.b.complete)).toBeUndefined();
    oneMessage(w, send!, recv!, 100, 4);
    expect(warns).toEqual([]);
  });

  it('an ACCEPT whose send fails, its listener closed once accept returned (as NCCL does): the repeated CONNECT still gets the ACCEPT', () => {
    const { w, l, c, recv } = lostAccept(-107, 'fake provider: transport endpoint is not connected');
    l.close();
    w.now += 501; // no answer: CONNECT again, to a listener that is closed
    expect(c.poll(w.a.complete)).toBeUndefined();
    w.settle();
    const send = c.poll(w.a.complete);
    expect(send).toBeDefined();
    expect(oneMessage(w, send!, recv!, 100, 5)).toEqual(pattern(5, 100));
    expect(warns).toEqual([]);
    // Once the comm is closed, a new CONNECT to that listener is refused: the connector fails at once.
    recv!.close();
    const again = w.a.ep.connect(l.handle);
    w.settle();
    expect(() => again.poll(w.a.complete)).toThrow(/connect: refused: the listener is closed/);
    expect(warns.filter((m) => /listener \d+, which is closed .*; refused/.test(m))).toHaveLength(1);
  });

  it('a connect is judged at the watchdog\'s ticks: held past its deadline it takes the ACCEPT that waited; with no answer a judged tick fails it', () => {
    const w = new World({ timeoutMs: 1000 });
    const l = w.b.ep.listen();
    const c = w.a.ep.connect(l.handle);
    // The thread (or the whole process) is held past the deadline before anything moved: the
    // first tick after it judges nothing, and the answer that comes then is taken.
    w.now += 1500;
    w.a.ep.tick(w.now, 1000, false);
    expect(c.poll(w.a.complete)).toBeUndefined();
    w.settle();
    const send = c.poll(w.a.complete);
    const recv = l.accept(w.b.complete);
    expect(send && recv).toBeTruthy();
    expect(oneMessage(w, send!, recv!, 100, 6)).toEqual(pattern(6, 100));
    // No answer at all (nothing delivers the CONNECT): not failed before the deadline, failed at
    // the first judged tick past it.
    const l2 = w.b.ep.listen();
    const c2 = w.a.ep.connect(l2.handle);
    w.now += 900;
    w.a.ep.tick(w.now);
    expect(c2.poll(w.a.complete)).toBeUndefined();
    w.now += 200;
    expect(c2.poll(w.a.complete)).toBeUndefined(); // past the deadline, but no tick has judged it
    w.a.ep.tick(w.now);
    expect(() => c2.poll(w.a.complete)).toThrow(/send comm \d+: connect: no answer from the listener within 1000 ms/);
    expect(warns).toEqual([]);
  });

  it('closing a listener refuses later connects; a stale handle is refused; both fail at once with the reason, not at the timeout', () => {
    const w = new World({ timeoutMs: 1000 });
    const l = w.b.ep.listen();
    const handle = l.handle;
    l.close();
    const c = w.a.ep.connect(handle);
    w.settle(); // no clock moves: the answer, not the timeout
    expect(() => c.poll(w.a.complete)).toThrow(/send comm \d+: connect: refused: the listener is closed/);
    expect(warns.join('\n')).toMatch(/listener \d+, which is closed .*; refused/);
    const l2 = w.b.ep.listen();
    const stale = l2.handle.slice();
    stale[12] ^= 0xff; // another nonce
    const c2 = w.a.ep.connect(stale);
    w.settle();
    expect(warns.join('\n')).toMatch(/stale handle/);
    expect(l2.accept(w.b.complete)).toBeUndefined();
    expect(() => c2.poll(w.a.complete)).toThrow(/connect: refused: the handle is stale/);
    expect(w.b.ep.stats.refused).toBe(2);
    expect(() => w.a.ep.connect(new Uint8Array(128))).toThrow(/not a tsnet libfabric handle/);
    // The listener still works, and the refusals' sends all came back.
    const c3 = w.a.ep.connect(l2.handle);
    w.settle();
    expect(c3.poll(w.a.complete)).toBeDefined();
    expect(l2.accept(w.b.complete)).toBeDefined();
    for (const side of [w.a, w.b]) side.check();
  });

  it('a refusal for another connect attempt (another connector nonce) says nothing of this one', () => {
    const w = new World({ timeoutMs: 1000 });
    const l = w.b.ep.listen();
    const c = w.a.ep.connect(l.handle);
    // Hold the CONNECT; meanwhile a refusal naming another attempt reaches the connecting comm.
    w.fabric.hold = (type, _len, imm) => type === 'send' && msgKind(imm) === MsgKind.CONNECT;
    w.settle();
    const comm = (c as unknown as { comm: OfiSendComm }).comm;
    const refusal = new Uint8Array(REFUSAL_BYTES);
    encodeRefusal((comm.connectorNonce ^ 1) >>> 0, Refusal.LISTENER_CLOSED, refusal);
    comm.onAccept(refusal);
    expect(c.poll(w.a.complete)).toBeUndefined();
    w.fabric.hold = undefined;
    w.settle();
    expect(c.poll(w.a.complete)).toBeDefined();
  });
});
