// The TCP transport. A comm is one control socket plus N data sockets; listen fills the
// handle with the device's addresses, a port and a random nonce; connect/accept are
// non-blocking state machines that NCCL's retries drive. Every new socket greets with a
// HELLO (magic, protocol version, nonce, connection id) and is refused otherwise (a WARN
// for the first few, then a count: refusals.ts), so a stranger on the port never becomes a
// comm nor breaks the listener.
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import { monoMs } from '../../clock';
import type { Config } from '../../config';
import type { LaneBinding } from '../../engine/native-link';
import { NativeLink } from '../../engine/native-link';
import type { Port } from '../../engine/port';
import { NetError, descriptorNote, internalError, sysMessage, systemError } from '../../errors';
import { log } from '../../log';
import { SEND_RING_BYTES, type StreamLink, recvRingBytes } from '../../protocol/link';
import { EAGER_POLICIES, LANE_POLICIES, STRIPE_POLICIES, type SchedulePolicy, byId, configuredPolicy } from '../../protocol/policies';
import { guidText } from '../guid';
import { recvComm, sendComm } from '../stream';
import { type CommHooks, type Connector, type Device, HOST_MEMORY_TRAITS, type Listener, type RecvComm, type SendComm, type Transport } from '../transport';
import { type NetDevice, discoverDevices } from './devices';
import { RefusalLog } from './refusals';
import { HELLO_BYTES, type Hello, Role, decodeHandle, decodeHello, encodeHandle, encodeHello } from './wire';

/** The native engine a TCP link's sockets are handed to. */
export interface TcpIo {
  binding: LaneBinding;
  port: Port;
}

/** The fd of a connected, paused Node socket with nothing buffered either way. */
function fdOf(s: net.Socket): number {
  const fd = (s as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) throw internalError('the socket has no file descriptor (not connected?)');
  if (s.readableLength > 0) throw internalError(`${s.readableLength} unread bytes wait in a Node socket being handed over`);
  if (s.writableLength > 0) throw internalError(`${s.writableLength} bytes are still queued in a Node socket being handed over`);
  return fd;
}

/** Hands the sockets (control first) to the native engine as one link; Node's sockets go. */
function adopt(io: TcpIo, socks: net.Socket[], policy: SchedulePolicy, what: string, rxBytes: number): StreamLink {
  const link = new NativeLink(io.port, io.binding, socks.map(fdOf), policy, what, rxBytes);
  for (const s of socks) s.destroy(); // closes Node's fds only: the engine holds dups
  return link;
}

/**
 * The listener's side: reads the greeting (HELLO_BYTES), then leaves the socket paused with
 * nothing buffered. It reads greedily: a connector sends nothing after its greeting before it
 * has every ACK, so more bytes are a stranger's. Returns what gives up on it (the listener's
 * tick, when no greeting came in time): the socket is destroyed and cb gets the error.
 */
function readHello(sock: net.Socket, cb: (err: Error | undefined, h?: Hello) => void): (err: Error) => void {
  const parts: Buffer[] = [];
  let have = 0;
  let done = false;
  const finish = (err?: Error, h?: Hello) => {
    if (done) return;
    done = true;
    sock.removeListener('data', onData);
    sock.removeListener('error', onError);
    sock.removeListener('end', onEnd);
    if (err) sock.destroy();
    cb(err, h);
  };
  const onData = (c: Buffer) => {
    parts.push(c);
    have += c.length;
    if (have < HELLO_BYTES) return;
    sock.pause();
    // Stop reading now: the next bytes belong to whoever takes the socket over.
    const handle = (sock as unknown as { _handle?: { readStop(): void; reading: boolean } })._handle;
    if (handle) {
      handle.readStop();
      handle.reading = false;
    }
    if (have > HELLO_BYTES) return finish(new Error(`${have - HELLO_BYTES} unexpected bytes after the greeting`));
    const h = decodeHello(Buffer.concat(parts));
    if (typeof h === 'string') finish(new Error(h));
    else finish(undefined, h);
  };
  const onError = (e: Error) => finish(e);
  const onEnd = () => finish(new Error('closed before greeting'));
  sock.on('data', onData);
  sock.on('error', onError);
  sock.on('end', onEnd);
  return (err) => finish(err);
}

interface Incoming {
  hello?: Hello; // the control socket's
  socks: (net.Socket | undefined)[];
  lanes: number;
  /** When its first socket greeted (monoMs), and the same on the µs clock of lastAccept (performance.now(), ms). */
  since: number;
  t0: number;
  /** Who it is (for the refusal's WARN). */
  from: string;
}

// A listener whose process is out of file descriptors takes each connection and closes it at
// once, saying nothing (libuv's way out of EMFILE); the connector sees only the close.
const DROPPED = ' (the listener closed it, or its process is out of file descriptors: then it drops connections without a word)';

/** EMFILE or ENFILE where the process cannot open a file now; else undefined. */
function outOfDescriptors(): string | undefined {
  try {
    fs.closeSync(fs.openSync('/dev/null', 'r'));
    return undefined;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return code === 'EMFILE' || code === 'ENFILE' ? code : undefined;
  }
}

class TcpListener implements Listener {
  readonly handle: Uint8Array;
  private readonly server: net.Server;
  private readonly nonce = randomBytes(8);
  private readonly incoming = new Map<string, Incoming>();
  /** Sockets whose greeting has not come yet: since when (monoMs), and what gives up on them. */
  private readonly greeting = new Map<net.Socket, { since: number; giveUp: (err: Error) => void }>();
  /** Links ready for accept: how long their handshake took (µs) and since when they wait (performance.now(), ms). */
  private readonly ready: { link: StreamLink; handshakeUs: number; at: number }[] = [];
  lastAccept: { handshakeUs: number; waitedUs: number } | undefined;
  private readonly refusals: RefusalLog;
  private closed = false;

  constructor(
    private readonly dev: NetDevice,
    private readonly io: TcpIo,
    private readonly timeoutMs: number,
  ) {
    this.refusals = new RefusalLog(`listener on ${dev.name}`);
    this.server = net.createServer((s) => this.greet(s));
    this.server.on('error', (e) => {
      if (!this.closed) log.warn(`listener on ${dev.name}: ${sysMessage(e)}`);
    });
    // Bound synchronously (no host name lookup), on every address: the handle names the device's.
    this.server.listen({ port: 0, host: undefined, ipv6Only: false, backlog: 1024 });
    const bound = this.server.address();
    if (!bound || typeof bound === 'string') {
      // Node reports why only at its next tick, after this call has answered NCCL: its error
      // event is left unsaid, and the WARN names the likeliest cause where it is the cause.
      this.closed = true;
      this.refusals.close();
      this.server.close();
      const out = outOfDescriptors();
      throw systemError(`listen on ${dev.name}: no listening socket could be made${out ? `, the process is out of file descriptors${descriptorNote(out)}` : ''}`);
    }
    const port = bound.port;
    this.handle = encodeHandle({
      nonce: this.nonce,
      rails: dev.nics.map((n) => ({ family: n.family, address: n.address, port })),
    });
  }

  accept(hooks: CommHooks): RecvComm | undefined {
    const r = this.ready.shift();
    if (!r) return undefined;
    this.lastAccept = { handshakeUs: r.handshakeUs, waitedUs: (performance.now() - r.at) * 1000 };
    return recvComm(r.link, hooks);
  }

  close(): void {
    this.closed = true;
    this.refusals.close();
    this.server.close();
    for (const g of [...this.greeting.values()]) g.giveUp(new Error('the listener closed'));
    this.greeting.clear();
    const waiting = this.incoming.size + this.ready.length;
    for (const inc of this.incoming.values()) this.drop(inc);
    this.incoming.clear();
    this.ready.splice(0).forEach((r) => r.link.close(false));
    if (waiting) log.info(`listener on ${this.dev.name}: closed with ${waiting} connection(s) not yet accepted; dropped`);
  }

  /**
   * The watchdog's tick: a socket with no greeting, and a connection not complete, for the
   * timeout are refused. Not where judge is false (the first tick after the thread was held:
   * what came meanwhile is read first).
   */
  tick(now: number, _timeoutMs: number, judge: boolean): void {
    if (!judge || this.closed) return;
    for (const g of [...this.greeting.values()]) if (now - g.since > this.timeoutMs) g.giveUp(new Error(`no greeting within ${this.timeoutMs} ms`));
    for (const [key, inc] of [...this.incoming]) {
      if (now - inc.since <= this.timeoutMs) continue;
      this.refusals.refuse(inc.from, `connection ${key} did not complete within ${this.timeoutMs} ms`);
      this.drop(inc);
      this.incoming.delete(key);
    }
  }

  private greet(s: net.Socket): void {
    s.setNoDelay(true);
    const from = `${s.remoteAddress}:${s.remotePort}`;
    const giveUp = readHello(s, (err, h) => {
      this.greeting.delete(s);
      if (this.closed) return s.destroy();
      const refuse = (why: string) => {
        this.refusals.refuse(from, why);
        s.destroy();
      };
      if (err || !h) return refuse(err?.message ?? 'no greeting');
      if (!h.nonce.equals(this.nonce)) return refuse('wrong nonce (a stale handle or a stranger)');
      if (h.role === Role.ACK || h.lane > h.lanes) return refuse(`bad greeting (role ${h.role}, lane ${h.lane} of ${h.lanes})`);
      const key = h.connId.toString('hex');
      let inc = this.incoming.get(key);
      if (!inc) {
        inc = { socks: new Array(1 + h.lanes).fill(undefined), lanes: h.lanes, since: monoMs(), t0: performance.now(), from };
        this.incoming.set(key, inc);
      }
      const index = h.role === Role.CONTROL ? 0 : 1 + h.lane;
      if (h.lanes !== inc.lanes || index >= inc.socks.length || inc.socks[index]) return refuse('greeting does not fit its connection');
      inc.socks[index] = s;
      if (h.role === Role.CONTROL) inc.hello = h;
      if (inc.hello && inc.socks.every(Boolean)) {
        this.incoming.delete(key);
        this.complete(inc, inc.hello);
      }
    });
    this.greeting.set(s, { since: monoMs(), giveUp });
  }

  private complete(inc: Incoming, h: Hello): void {
    const socks = inc.socks as net.Socket[];
    const [eager, stripes, laneChoice] = [byId(EAGER_POLICIES, h.policies[0]), byId(STRIPE_POLICIES, h.policies[1]), byId(LANE_POLICIES, h.policies[2])];
    if (!eager || !stripes || !laneChoice) {
      this.refusals.refuse(`${socks[0].remoteAddress}`, `the sender asks for policies ${h.policies.join('/')}, which this tsnet does not know`);
      socks.forEach((s) => s.destroy());
      return;
    }
    const policy: SchedulePolicy = { eagerMax: h.eagerMax, minStripe: h.minStripe, lanes: h.lanes, eager, stripes, laneChoice };
    // The ACK goes through Node before the sockets are handed over: once every one is written,
    // no byte is left in Node, and the connector sends nothing before it has them all.
    const ack = encodeHello({ ...h, role: Role.ACK, status: 0 });
    let left = socks.length;
    const what = `${socks[0].remoteAddress} -> ${this.dev.name}, ${h.lanes} data socket(s)`;
    for (const s of socks)
      s.write(ack, (err) => {
        if (err) {
          log.warn(`listener on ${this.dev.name}: a connection from ${socks[0].remoteAddress} failed during its handshake: ${sysMessage(err)}`);
          socks.forEach((x) => x.destroy());
          left = -1;
          return;
        }
        if (--left !== 0) return;
        if (this.closed) return socks.forEach((x) => x.destroy()); // closed during the handshake
        try {
          const link = adopt(this.io, socks, policy, what, recvRingBytes(h.eagerMax));
          const at = performance.now();
          this.ready.push({ link, handshakeUs: (at - inc.t0) * 1000, at });
        } catch (e) {
          log.warn(`listener on ${this.dev.name}: ${(e as Error).message}`);
          socks.forEach((x) => x.destroy());
        }
      });
  }

  private drop(inc: Incoming | undefined): void {
    if (!inc) return;
    inc.socks.forEach((s) => s?.destroy());
  }
}

class TcpConnector implements Connector {
  private readonly socks: net.Socket[] = [];
  private acked = 0;
  private failed: NetError | undefined;
  private link: StreamLink | undefined;
  private taken = false;
  /** When the connect began (monoMs), and whom it asks (for the timeout's words). */
  private readonly since = monoMs();
  readonly timing: { begun: number; ready?: number } = { begun: performance.now() };
  private readonly to: string;

  constructor(
    dev: NetDevice,
    handle: Uint8Array,
    private readonly policy: SchedulePolicy,
    private readonly io: TcpIo,
    private readonly timeoutMs: number,
  ) {
    const h = decodeHandle(handle);
    this.to = `${h.rails[0].address}:${h.rails[0].port}`;
    const connId = randomBytes(8);
    const policies: [number, number, number] = [policy.eager.id, policy.stripes.id, policy.laneChoice.id];
    const base = { nonce: h.nonce, connId, lanes: policy.lanes, eagerMax: policy.eagerMax, minStripe: policy.minStripe, status: 0, policies };
    const multi = dev.nics.length > 1 || h.rails.length > 1;
    for (let i = 0; i <= policy.lanes; i++) {
      // Socket i rides rail i mod rails: a multi-NIC device spreads its sockets over its NICs.
      const rail = h.rails[i % h.rails.length];
      const nic = dev.nics[i % dev.nics.length];
      // The answer is read in place, and not a byte further: the listener's side may write its
      // first frames (a CLOSE, a heartbeat) as soon as it has its comm, before this side has read
      // the ACK. Those bytes belong to the link: they stay in the kernel for the engine. (A
      // greedy read took them with the ACK and failed the connect: "unexpected bytes after the
      // greeting".)
      const answer = Buffer.alloc(HELLO_BYTES);
      let have = 0;
      const s = net.connect({
        host: rail.address,
        port: rail.port,
        localAddress: multi ? nic.address : undefined,
        onread: {
          buffer: () => answer.subarray(have < HELLO_BYTES ? have : 0),
          callback: (n: number) => {
            have += n;
            if (have < HELLO_BYTES) return true;
            const ack = decodeHello(answer);
            // After this callback, which stops the reading: the last answer hands the socket over.
            queueMicrotask(() => {
              if (typeof ack === 'string') this.onAck(i, rail.address, new Error(ack));
              else this.onAck(i, rail.address, undefined, ack, h.nonce);
            });
            return false; // stops reading before the next byte
          },
        },
      });
      s.setNoDelay(true);
      const greeting = encodeHello({ ...base, role: i === 0 ? Role.CONTROL : Role.DATA, lane: i === 0 ? 0 : i - 1 });
      s.on('connect', () => s.write(greeting));
      s.on('end', () => {
        if (have < HELLO_BYTES) this.fail(systemError(`connect to ${rail.address}:${rail.port}: the listener closed socket ${i} before answering${DROPPED}`));
      });
      s.on('error', (e) => {
        const reset = (e as NodeJS.ErrnoException).code === 'ECONNRESET' && have < HELLO_BYTES;
        this.fail(systemError(`connect to ${rail.address}:${rail.port}: ${sysMessage(e)}${reset ? DROPPED : ''}`));
      });
      this.socks.push(s);
    }
  }

  /**
   * The watchdog's tick: no answer within the timeout fails the connect. Not where judge is
   * false (the first tick after the thread was held: an answer that came meanwhile is read first).
   */
  tick(now: number, _timeoutMs: number, judge: boolean): void {
    if (judge && now - this.since > this.timeoutMs) this.fail(systemError(`connect: no answer from ${this.to} within ${this.timeoutMs} ms`));
  }

  poll(hooks: CommHooks): SendComm | undefined {
    if (this.failed) throw this.failed;
    if (!this.link || this.taken) return undefined;
    this.taken = true;
    return sendComm(this.link, hooks);
  }

  close(): void {
    this.socks.forEach((s) => s.destroy());
    if (!this.taken) this.link?.close(false);
  }

  private onAck(i: number, addr: string, err: Error | undefined, ack?: Hello, nonce?: Buffer): void {
    if (this.failed) return;
    if (err || !ack) return this.fail(systemError(`connect to ${addr}: ${err?.message ?? 'no answer'}`));
    if (ack.role !== Role.ACK || !ack.nonce.equals(nonce!) || ack.status !== 0)
      return this.fail(systemError(`connect to ${addr}: the listener refused socket ${i} (status ${ack.status})`));
    if (++this.acked < this.socks.length) return;
    for (const s of this.socks) {
      s.removeAllListeners('error');
      s.removeAllListeners('end');
    }
    const to = `${this.socks[0].remoteAddress}:${this.socks[0].remotePort}`;
    try {
      this.link = adopt(this.io, this.socks, this.policy, `-> ${to}, ${this.policy.lanes} data socket(s)`, SEND_RING_BYTES);
      this.timing.ready = performance.now();
    } catch (e) {
      this.fail(e instanceof NetError ? e : systemError(`connect to ${to}: ${(e as Error).message}`));
    }
  }

  private fail(err: NetError): void {
    if (this.failed || this.link) return;
    this.failed = err;
    this.socks.forEach((s) => s.destroy());
  }
}

export class TcpTransport implements Transport {
  readonly name = 'tcp';
  readonly traits = HOST_MEMORY_TRAITS;
  readonly devices: Device[];
  readonly policy: SchedulePolicy;
  private readonly netDevices: NetDevice[];
  private readonly timeoutMs: number;

  constructor(
    config: Config,
    private readonly io: TcpIo,
    discovered?: NetDevice[],
  ) {
    this.netDevices = discovered ?? discoverDevices({ ifname: config.socketIfname, family: config.socketFamily, groups: config.deviceGroups });
    if (this.netDevices.length === 0)
      throw systemError(`no usable network interface${config.socketIfname ? ` matches NCCL_SOCKET_IFNAME=${config.socketIfname}` : ''}`);
    this.devices = this.netDevices.map((d) => ({ name: d.name, pciPath: d.pciPath, guid: d.guid, speedMbps: d.speedMbps, rails: d.nics.length }));
    for (const d of this.netDevices)
      log.info(`device ${d.name}: ${d.nics.map((n) => `${n.name} ${n.address}`).join(', ')}, ${d.speedMbps} Mbps, guid ${guidText(d.guid)}`);
    this.policy = configuredPolicy(config);
    this.timeoutMs = config.timeoutSec * 1000;
  }

  listen(dev: number): Listener {
    return new TcpListener(this.netDevices[dev], this.io, this.timeoutMs);
  }

  connect(dev: number, handle: Uint8Array): Connector {
    return new TcpConnector(this.netDevices[dev], handle, this.policy, this.io, this.timeoutMs);
  }

  poll(): void {
    this.io.port.poll();
  }

  flush(): boolean {
    this.io.port.flush();
    return this.io.port.backlog;
  }
}
