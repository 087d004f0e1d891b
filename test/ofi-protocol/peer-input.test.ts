// What a peer sends that breaks the protocol's assumptions, over the fake fabric: each ends in
// an error on the comm it concerns (or a refused connection), never in an exception out of the
// completion handler (the engine's port only logged those: state half updated, the batch's
// bounce buffers never reposted), a comm or bounce buffer leaked per message, or a provider
// reading a peer address past its end.
import { split } from '../support/addr';
import { describe, expect, it } from 'vitest';
import { LogLevel } from '../../plugin/abi';
import { CqFlag } from '../../plugin/transports/ofi/fabric';
import type { OfiRecvComm } from '../../plugin/transports/ofi/recv-comm';
import type { OfiSendComm } from '../../plugin/transports/ofi/send-comm';
import { MsgKind, SEGS_ACK, decodeHandle, encodeConnect, immMsg, immWrite } from '../../plugin/transports/ofi/wire';
import { captureLog } from '../support/log-capture';
import { World, buf } from './harness';

const log = captureLog();
const warns = () => log.filter((l) => l.level === LogLevel.WARN).map((l) => l.msg);

/** A CONNECT to b's listener from a third host c, with names of the given bytes. */
function strangerConnect(w: World, name: Uint8Array, times: number): void {
  const listener = w.b.ep.listen();
  const h = decodeHandle(listener.handle);
  if (typeof h === 'string') throw new Error(h);
  const c = w.side('c', 1);
  const crail = c.host.rails[0];
  const peer = crail.insertPeer(w.b.host.rails[0].name);
  const mem = crail.alloc(512);
  for (let k = 0; k < times; k++) {
    const len = encodeConnect(
      { listenerNonce: h.nonce, connectorNonce: 77, comm: 9, rails: 1, eagerMax: 8192, flags: 0, pid: 5, start: 0, boot: new Uint8Array(16), mailboxAddr: 0, mailboxKeys: [{ lo: 0, hi: 0 }], names: [name] },
      mem.bytes,
    );
    crail.send(peer, ...split(mem.addr), len, mem.reg.desc, immMsg(MsgKind.CONNECT, h.listener), 4000 + k);
    w.fabric.run(() => false, 10_000);
  }
}

describe('peer input that breaks the protocol', () => {
  it('CUDA IPC: an acknowledgement naming a receive before the first fails the send comm (it threw a TypeError out of the handler)', () => {
    const w = new World({ config: { gpuIpc: true } });
    const { send } = w.connect();
    const s = send as unknown as OfiSendComm;
    const rail = w.a.host.rails[0];
    const ack = { token: 0, status: 0, flags: CqFlag.REMOTE_WRITE | CqFlag.REMOTE_CQ_DATA, len: 0, imm: immWrite(s.id, 5, 0, SEGS_ACK), immHi: 0, src: s.peer[0] };
    expect(() => w.a.ep.onCompletions(rail, [ack])).not.toThrow();
    expect(s.failed?.message).toMatch(/protocol error: an acknowledgement of receive -\d+, before the first/);
  });

  it('a CONNECT whose address the provider refuses: the connection is refused, no comm is left behind (one leaked per CONNECT before)', () => {
    const w = new World({ check: false });
    const brail = w.b.host.rails[0];
    const insert = brail.insertPeer.bind(brail);
    brail.insertPeer = (name: Uint8Array) => {
      if (name[0] === 0x42) throw new Error('fi_av_insert of a peer\'s address: Invalid argument');
      return insert(name);
    };
    strangerConnect(w, new Uint8Array(brail.name.length).fill(0x42), 3);
    expect(warns().filter((m) => /cannot accept a connection: fi_av_insert/.test(m))).toHaveLength(3);
    for (let id = 1; id <= 5; id++) expect(w.b.ep.comm(id), `comm ${id}`).toBeUndefined();
    // b's own connections still work.
    const { send, recv } = w.connect();
    const reg = w.b.region(64);
    recv.irecv(1, [buf(reg, 0, 64, 3)]);
    const src = w.a.region(64);
    send.isend(2, buf(src, 0, 64, 3));
    w.run(() => w.b.has(1) && w.a.has(2), 'a transfer after the refused connections');
    expect(w.b.take(1)).toEqual({ code: 0, sizes: [64] });
  });

  it('a CONNECT with an address shorter than the provider\'s is refused before the provider reads it', () => {
    const w = new World({ check: false });
    const brail = w.b.host.rails[0];
    let inserted = 0;
    const insert = brail.insertPeer.bind(brail);
    brail.insertPeer = (name: Uint8Array) => {
      inserted++;
      return insert(name);
    };
    strangerConnect(w, new Uint8Array([1]), 1);
    expect(inserted).toBe(0);
    expect(warns().some((m) => new RegExp(`cannot accept a connection: .*a peer's address on NIC 0 is 1 bytes; this provider's are ${brail.name.length}`).test(m)), warns().join('\n')).toBe(true);
  });

  it('an ACCEPT whose address the provider refuses fails the connect, and its bounce buffer goes back (it stayed held, one per answer)', () => {
    const w = new World({ nicsA: 2, nicsB: 2, check: false });
    w.a.host.rails[1].insertPeer = () => {
      throw new Error('fi_av_insert of a peer\'s address: Invalid argument');
    };
    const listener = w.b.ep.listen();
    const connector = w.a.ep.connect(listener.handle);
    let err: unknown;
    for (let i = 0; i < 5 && !err; i++) {
      w.fabric.run(() => false, 10_000);
      listener.accept(w.b.complete);
      try {
        connector.poll(w.a.complete);
      } catch (e) {
        err = e;
      }
      w.now += 600;
    }
    expect(String(err)).toMatch(/connect: the answer's addresses: fi_av_insert/);
    expect(w.a.ep.pool.accounts.map((a) => a.held)).toEqual([0, 0]);
    expect(w.a.ep.check()).toBeUndefined();
  });

  it('a handler that throws fails the comm its completion names; the rest of the batch is handled', () => {
    const w = new World({});
    const { recv } = w.connect();
    const r = recv as unknown as OfiRecvComm;
    const { recv: other } = w.connect();
    const reg = w.b.region(64);
    other.irecv(3, [buf(reg, 0, 64, 3)]);
    (r as unknown as { onRemoteWrite: () => void }).onRemoteWrite = () => {
      throw new TypeError('something the peer sent was not what it should be');
    };
    const rail = w.b.host.rails[0];
    const write = { token: 0, status: 0, flags: CqFlag.REMOTE_WRITE | CqFlag.REMOTE_CQ_DATA, len: 0, imm: immWrite(r.id, 0, 0, 1), immHi: 0, src: r.peer[0] };
    const o = other as unknown as OfiRecvComm;
    const heartbeat = { token: 0, status: 0, flags: CqFlag.REMOTE_WRITE | CqFlag.REMOTE_CQ_DATA, len: 0, imm: immWrite(o.id, 0, 0, 1), immHi: 0, src: o.peer[0] };
    expect(() => w.b.ep.onCompletions(rail, [write, heartbeat])).not.toThrow();
    expect(r.failed?.message).toMatch(/protocol error: handling what the peer sent failed: something the peer sent was not what it should be/);
    expect((other as unknown as OfiRecvComm).failed).toBeUndefined();
  });
});
