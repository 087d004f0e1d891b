// Where the provider names the sender of a message or remote write (FI_SOURCE), what names a
// comm is taken only from that comm's peer. A stranger that reaches the endpoint (another
// process on the fabric, in the address vector or not) and names a comm by its id could
// otherwise fail it, complete its receives, keep a dead peer's comm looking alive, or break a
// connect. Each such case runs with the fake provider naming senders, and again without (the
// stranger's input then reaches the comm, as with a provider that cannot say), so that every
// test shows the check is what stops it. The last test bounds the connections a listener holds
// for accept.
import { split } from '../support/addr';
import { describe, expect, it } from 'vitest';
import { LogLevel } from '../../plugin/abi';
import { MAX_UNACCEPTED } from '../../plugin/transports/ofi/connect';
import type { OfiRecvComm } from '../../plugin/transports/ofi/recv-comm';
import type { OfiSendComm } from '../../plugin/transports/ofi/send-comm';
import { MsgKind, decodeHandle, encodeAccept, encodeConnect, immMsg, immWrite, msgKind } from '../../plugin/transports/ofi/wire';
import { captureLog } from '../support/log-capture';
import type { FakeRail } from './fake-fabric';
import { World, buf, expectBytes, pattern } from './harness';

const log = captureLog();
const warns = () => log.filter((l) => l.level === LogLevel.WARN).map((l) => l.msg);

interface Stranger {
  rail: FakeRail;
  /** The stranger's id for b's NIC 0. */
  toB: number;
  mem: { addr: number; bytes: Uint8Array; reg: { desc: number } };
}

/**
 * A process on the fabric with no endpoint of tsnet's: it posts what it likes. known: b has its
 * address in b's address vector (as it would after any connection between them).
 */
function stranger(w: World, known: boolean): Stranger {
  const host = w.fabric.host('c', 1);
  const rail = host.rails[0];
  rail.onCompletions = () => {};
  for (let i = 0; i < 8; i++) rail.postRecv(rail.alloc(4096), 0, 4096, 9000 + i); // room for answers
  const toB = rail.insertPeer(w.b.host.rails[0].name);
  if (known) w.b.ep.peerId(0, rail.name);
  return { rail, toB, mem: rail.alloc(4096) };
}

function transferWorks(w: World, send: { isend: OfiSendComm['isend'] }, recv: { irecv: OfiRecvComm['irecv'] }, slot: number): void {
  const dst = w.b.region(256);
  const src = w.a.region(256);
  const data = pattern(slot, 256);
  src.bytes!.set(data);
  recv.irecv(slot, [buf(dst, 0, 256, 3)]);
  send.isend(slot + 100, buf(src, 0, 256, 3));
  w.run(() => w.b.has(slot) && w.a.has(slot + 100), 'a transfer between the peers');
  expect(w.b.take(slot)).toEqual({ code: 0, sizes: [256] });
  expect(w.a.take(slot + 100)).toEqual({ code: 0, sizes: [256] });
  expectBytes(dst.bytes!, 0, data);
}

/** A connected pair, and a stranger's 2-byte eager message (shorter than its header) naming b's receive comm. */
function shortEager(opts: ConstructorParameters<typeof World>[0], known: boolean) {
  const w = new World(opts);
  const { send, recv } = w.connect();
  const r = recv as unknown as OfiRecvComm;
  const c = stranger(w, known);
  c.rail.send(c.toB, ...split(c.mem.addr), 2, c.mem.reg.desc, immMsg(MsgKind.EAGER, r.id), 1);
  w.settle();
  return { w, send: send as unknown as OfiSendComm, r };
}

describe('senders (FI_SOURCE)', () => {
  for (const known of [true, false])
    it(`an eager message from a stranger ${known ? 'in' : 'not in'} the address vector is dropped; the comm it names lives (a 2-byte one failed it)`, () => {
      const { w, send, r } = shortEager({}, known);
      expect(r.failed).toBeUndefined();
      expect(w.b.ep.stats.foreign).toBe(1);
      const from = known ? 'from peer \\d+' : 'from a sender not in the address vector';
      expect(warns().some((m) => new RegExp(`rail 0: an eager message for b recv comm ${r.id} ${from}, which is not its peer; dropped`).test(m)), warns().join('\n')).toBe(true);
      transferWorks(w, send, r, 1);
      w.check(); // the stranger's bounce buffer came back
    });

  it('where remote writes name no sender (rxm), messages are still checked and transfers work', () => {
    const { w, send, r } = shortEager({ fake: { sourceWrites: false } }, true);
    expect(r.failed).toBeUndefined();
    expect(w.b.ep.stats.foreign).toBe(1);
    for (let k = 1; k <= 4; k++) transferWorks(w, send, r, k);
  });

  it('shm of libfabric 1.17 names an unknown sender 0, the endpoint itself: that passes (counted), so it stops only known strangers there', () => {
    const { w, r } = shortEager({ fake: { shmSource: true } }, false);
    expect(w.b.ep.stats.unnamed).toBeGreaterThanOrEqual(1);
    expect(r.failed?.message).toMatch(/an eager message of 2 bytes, shorter than its header/);
  });

  it('shm of libfabric 1.17 names some peers 0 for good: their traffic passes, over 3 rails', () => {
    let unnamed = 0;
    for (let seed = 1; seed <= 6; seed++) {
      const w = new World({ seed, nicsA: 3, fake: { shmSource: true } });
      const { send, recv } = w.connect();
      for (let k = 1; k <= 6; k++) transferWorks(w, send as unknown as OfiSendComm, recv as unknown as OfiRecvComm, k);
      expect(w.a.ep.stats.foreign + w.b.ep.stats.foreign).toBe(0);
      unnamed += w.a.ep.stats.unnamed + w.b.ep.stats.unnamed;
    }
    expect(unnamed).toBeGreaterThan(0);
  });

  it('without FI_SOURCE the same message reaches the comm and fails it', () => {
    const { w, r } = shortEager({ fake: { source: false } }, true);
    expect(w.b.ep.checkSenders).toBe(false);
    expect(r.failed?.message).toMatch(/an eager message of 2 bytes, shorter than its header/);
  });

  for (const [source, sourceWrites] of [[true, true], [true, false], [false, false]])
    it(`a stranger's remote write naming a posted receive ${sourceWrites ? 'does not complete it' : `completes it (${source ? 'senders of writes not named, as by rxm' : 'no FI_SOURCE'})`}`, () => {
      const w = new World({ fake: { source, sourceWrites } });
      expect([w.b.ep.checkSenders, w.b.ep.checkWriters]).toEqual([source, sourceWrites]);
      const { send, recv } = w.connect();
      const r = recv as unknown as OfiRecvComm;
      const dst = w.b.region(256);
      recv.irecv(1, [buf(dst, 0, 256, 3)]);
      w.settle();
      const c = stranger(w, true);
      c.mem.bytes.fill(0xee, 0, 256);
      const reg = dst.regs[0];
      c.rail.write(c.toB, ...split(c.mem.addr), 256, c.mem.reg.desc, ...split(dst.base + reg.remoteDelta), reg.keyLo, reg.keyHi, immWrite(r.id, 0, 0, 1), 2, 256);
      w.settle();
      if (!sourceWrites) {
        expect(w.b.take(1)).toEqual({ code: 0, sizes: [256] }); // the stranger's bytes, as a receive of the peer's
        return;
      }
      expect(w.b.has(1)).toBe(false);
      expect(w.b.ep.stats.foreign).toBe(1);
      // The peer's send then completes the receive, with its own bytes.
      const src = w.a.region(256);
      const data = pattern(5, 256);
      src.bytes!.set(data);
      send.isend(2, buf(src, 0, 256, 3));
      w.run(() => w.b.has(1) && w.a.has(2), 'the peer\'s send');
      expect(w.b.take(1)).toEqual({ code: 0, sizes: [256] });
      expectBytes(dst.bytes!, 0, data);
    });

  for (const source of [true, false])
    it(`a stranger's heartbeats ${source ? 'do not keep' : 'keep (no FI_SOURCE)'} a silent peer's comm alive`, () => {
      const w = new World({ fake: { source } });
      const { recv } = w.connect();
      const r = recv as unknown as OfiRecvComm;
      recv.irecv(1, [buf(w.b.region(64), 0, 64, 3)]);
      w.settle();
      const c = stranger(w, true);
      // The peer goes silent (its endpoint is never ticked again); only b's clock moves.
      for (let s = 0; s < 12; s++) {
        c.rail.send(c.toB, ...split(c.mem.addr), 0, c.mem.reg.desc, immMsg(MsgKind.HEARTBEAT, r.id), 10 + s);
        w.settle();
        w.now += 1000;
        w.b.ep.tick(w.now);
      }
      if (source) {
        expect(r.failed?.message).toMatch(/nothing heard from the peer for 1\d\.\d s with 1 request\(s\) pending/);
        expect(w.b.take(1).code).not.toBe(0);
      } else expect(r.failed).toBeUndefined();
    });

  for (const source of [true, false])
    it(`a stranger's ACCEPT ahead of the listener's ${source ? 'is dropped; the connect completes' : 'breaks the connect (no FI_SOURCE)'}`, () => {
      const w = new World({ fake: { source } });
      const listener = w.b.ep.listen();
      const connector = w.a.ep.connect(listener.handle);
      const id = [1, 2, 3, 4].find((i) => w.a.ep.comm(i) && !w.a.ep.comm(i)!.isRecv)!;
      // The stranger, known to a, answers first: the CONNECT waits until its ACCEPT was taken.
      const host = w.fabric.host('c', 1);
      const rail = host.rails[0];
      rail.onCompletions = () => {};
      w.a.ep.peerId(0, rail.name);
      const toA = rail.insertPeer(w.a.host.rails[0].name);
      const mem = rail.alloc(512);
      const len = encodeAccept({ connectorNonce: 12345, comm: 7, rails: 1, eagerCapacity: 8192, pid: 5, start: 0, boot: new Uint8Array(16), names: [rail.name] }, mem.bytes);
      rail.send(toA, ...split(mem.addr), len, mem.reg.desc, immMsg(MsgKind.ACCEPT, id), 1);
      let taken = false;
      const before = w.a.ep.stats.foreign;
      w.fabric.hold = (_type, _len, imm) => msgKind(imm) === MsgKind.CONNECT && !taken;
      const origin = w.a.host.rails[0].onCompletions!;
      w.a.host.rails[0].onCompletions = (r, batch) => {
        origin(r, batch);
        if (batch.some((c) => msgKind(c.imm) === MsgKind.ACCEPT)) taken = true;
      };
      let sendComm: unknown;
      let err: unknown;
      let recvComm: unknown;
      w.run(() => {
        try {
          sendComm ??= connector.poll(w.a.complete);
        } catch (e) {
          err = e;
        }
        recvComm ??= listener.accept(w.b.complete);
        return !!err || (!!sendComm && !!recvComm);
      }, 'the connect');
      if (source) {
        expect(err).toBeUndefined();
        expect(w.a.ep.stats.foreign).toBe(before + 1);
        expect((sendComm as OfiSendComm).peerComm).toBe((recvComm as OfiRecvComm).id);
      } else expect(String(err)).toMatch(/connect: an answer to another connect attempt/);
    });

  for (const reused of [false, true])
    it(`control messages on rail 1 that come before the ACCEPT wait for it (2 rails${reused ? ', the peer known from an earlier comm' : ''}); they were dropped and the sends waited for good`, () => {
      const w = new World({ nicsA: 2, nicsB: 2, config: { rrCtrl: true } });
      if (reused) {
        // An earlier comm between the same endpoints: b's rail-1 address is in a's address
        // vector, so its early write is named (peer 1), as in aws-ofi-nccl's reuse_listen_comm.
        const first = w.connect();
        transferWorks(w, first.send as unknown as OfiSendComm, first.recv as unknown as OfiRecvComm, 1);
      }
      const listener = w.b.ep.listen();
      const connector = w.a.ep.connect(listener.handle);
      let released = false;
      w.fabric.hold = (type, _len, imm) => type === 'send' && msgKind(imm) === MsgKind.ACCEPT && !released;
      let send: OfiSendComm | undefined;
      let recv: OfiRecvComm | undefined;
      w.run(() => {
        send ??= connector.poll(w.a.complete) as unknown as OfiSendComm | undefined;
        recv ??= listener.accept(w.b.complete) as unknown as OfiRecvComm | undefined;
        return !!recv;
      }, 'the accept');
      // b posts receives: their control messages go round robin over both rails, ahead of the ACCEPT.
      const dsts = [0, 1, 2, 3].map(() => w.b.region(256));
      dsts.forEach((d, i) => recv!.irecv(10 + i, [buf(d, 0, 256, 3)]));
      w.settle();
      expect(send).toBeUndefined();
      released = true;
      w.run(() => !!(send ??= connector.poll(w.a.complete) as unknown as OfiSendComm | undefined), 'the connect');
      listener.close();
      for (let i = 0; i < 4; i++) {
        const r = w.a.region(256);
        r.bytes!.set(pattern(40 + i, 256));
        send!.isend(20 + i, buf(r, 0, 256, 3));
      }
      w.run(() => [0, 1, 2, 3].every((i) => w.b.has(10 + i) && w.a.has(20 + i)), 'the transfers announced before the ACCEPT');
      for (let i = 0; i < 4; i++) {
        expect(w.b.take(10 + i)).toEqual({ code: 0, sizes: [256] });
        expect(w.a.take(20 + i)).toEqual({ code: 0, sizes: [256] });
        expectBytes(dsts[i].bytes!, 0, pattern(40 + i, 256));
      }
      expect(w.a.ep.stats.foreign).toBe(0);
      expect(warns().filter((m) => /which is not its peer/.test(m))).toEqual([]);
      w.check();
    });

  it(`a listener holds at most ${MAX_UNACCEPTED} connections for accept: CONNECTs with ever new nonces take no more comm ids`, () => {
    const w = new World({ check: false });
    const listener = w.b.ep.listen();
    const h = decodeHandle(listener.handle);
    if (typeof h === 'string') throw new Error(h);
    const c = stranger(w, false);
    const n = MAX_UNACCEPTED + 20;
    for (let k = 0; k < n; k++) {
      const at = (k % 4) * 1024;
      const len = encodeConnect(
        { listenerNonce: h.nonce, connectorNonce: 1000 + k, comm: 9, rails: 1, eagerMax: 8192, flags: 0, pid: 5, start: 0, boot: new Uint8Array(16), mailboxAddr: 0, mailboxKeys: [{ lo: 0, hi: 0 }], names: [c.rail.name] },
        c.mem.bytes.subarray(at),
      );
      c.rail.send(c.toB, ...split(c.mem.addr + at), len, c.mem.reg.desc, immMsg(MsgKind.CONNECT, h.listener), 100 + k);
      w.fabric.run(() => false, 100_000);
    }
    let comms = 0;
    for (let id = 1; id < 2 * n; id++) if (w.b.ep.comm(id)) comms++;
    expect(comms).toBe(MAX_UNACCEPTED);
    expect(warns().filter((m) => /refused a connection: 256 connections already wait for accept/.test(m))).toHaveLength(1);
    listener.close();
    for (let id = 1; id < 2 * n; id++) expect(w.b.ep.comm(id)).toBeUndefined();
  });
});
