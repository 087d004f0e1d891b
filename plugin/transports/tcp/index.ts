// The TCP transport. A comm is one control socket plus N data sockets; listen fills the
// handle with the device's addresses, a port and a random nonce; connect/accept are
// non-blocking: the sockets' watches on the protocol thread's event loop (dial.ts, watch.ts,
// no Node sockets) move the handshake on, and NCCL's retries take the comm once it is up.
// Every new socket greets with a
// HELLO (magic, protocol version, nonce, connection id) and is refused otherwise (a WARN
// for the first few, then a count: refusals.ts), so a stranger on the port never becomes a
// comm nor breaks the listener.
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
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
import { EarlySend } from '../early';
import { AcceptQueue, type CommHooks, type ConnectTiming, type Connector, type Device, HOST_MEMORY_TRAITS, type Listener, type RecvComm, type SendComm, type Transport } from '../transport';
import { type NetDevice, discoverDevices } from './devices';
import { Dial, type DialBinding, EAGAIN, dialError } from './dial';
import { RefusalLog } from './refusals';
import { FdWatches } from './watch';
import { HELLO_BYTES, type Hello, Role, decodeHandle, decodeHello, encodeHandle, encodeHello } from './wire';

/** The native engine a TCP link's sockets are handed to. */
export interface TcpIo {
  binding: LaneBinding & DialBinding;
  port: Port;
}

interface Greeting {
  fd: number;
  watch: number;
  /** Who it is (for the refusal's WARN), and since when it is awaited (monoMs). */
  from: string;
  since: number;
  /** The greeting, and room to see that more came than a greeting. */
  buf: Buffer;
  have: number;
}

interface Incoming {
  hello?: Hello; // the control socket's
  fds: (number | undefined)[];
  lanes: number;
  /** When its first socket greeted (monoMs), and the same on the µs clock of lastAccept (performance.now(), ms). */
  since: number;
  t0: number;
  /** Who it is (for the refusal's WARN). */
  from: string;
}

// A listener whose process is out of file descriptors takes each connection and closes it at
// once (tcpAccept, as libuv did for Node's listeners); the connector sees only the close.
const DROPPED = ' (the listener closed it, or its process is out of file descriptors: then it drops connections without a word)';

const closeFd = (fd: number) => fs.closeSync(fd);

class TcpListener implements Listener {
  readonly handle: Uint8Array;
  private readonly fd: number;
  private readonly watch: number;
  private readonly nonce = randomBytes(8);
  private readonly incoming = new Map<string, Incoming>();
  /** Sockets whose greeting has not come yet. */
  private readonly greeting = new Map<number, Greeting>();
  /** Links ready for accept, with their handshakes' times. */
  private readonly ready = new AcceptQueue<StreamLink>();
  private readonly refusals: RefusalLog;
  private closed = false;

  constructor(
    private readonly dev: NetDevice,
    private readonly io: TcpIo,
    private readonly watches: FdWatches,
    private readonly timeoutMs: number,
  ) {
    this.refusals = new RefusalLog(`listener on ${dev.name}`);
    // On every address: the handle names the device's.
    const l = io.binding.tcpListen();
    if ('errno' in l) {
      const e = dialError(l.errno, l.syscall);
      const out = e.code === 'EMFILE' || e.code === 'ENFILE' ? e.code : undefined;
      this.refusals.close();
      const why = out
        ? `no listening socket could be made, the process is out of file descriptors${descriptorNote(out)}`
        : e.code === 'EADDRINUSE'
          ? `${sysMessage(e)}: no port is free for it, this host's connections use up its ephemeral port range (net.ipv4.ip_local_port_range); each TCP comm holds 1 + TSNET_NSOCKS connections: widen the range or use fewer sockets`
          : sysMessage(e);
      throw systemError(`listen on ${dev.name}: ${why}`);
    }
    this.fd = l.fd;
    try {
      this.watch = watches.watch(l.fd, false, () => this.acceptAll());
    } catch (e) {
      closeFd(l.fd);
      this.refusals.close();
      throw e;
    }
    this.handle = encodeHandle({
      nonce: this.nonce,
      rails: dev.nics.map((n) => ({ family: n.family, address: n.address, port: l.port })),
    });
  }

  /** A comm ready for accept (the listening socket's watch takes the connections between calls). */
  accept(hooks: CommHooks): RecvComm | undefined {
    const link = this.ready.shift();
    return link && recvComm(link, hooks);
  }

  get lastAccept(): { handshakeUs: number; waitedUs: number } | undefined {
    return this.ready.lastAccept;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.refusals.close();
    this.watches.unwatch(this.watch);
    closeFd(this.fd);
    for (const g of [...this.greeting.values()]) this.dropGreeting(g);
    const waiting = this.incoming.size + this.ready.length;
    for (const inc of this.incoming.values()) this.drop(inc);
    this.incoming.clear();
    this.ready.drain().forEach((link) => link.close(false));
    if (waiting) log.info(`listener on ${this.dev.name}: closed with ${waiting} connection(s) not yet accepted; dropped`);
  }

  /**
   * The watchdog's tick: a socket with no greeting, and a connection not complete, for the
   * timeout are refused. Not where judge is false (the first tick after the thread was held:
   * what came meanwhile is read first).
   */
  tick(now: number, _timeoutMs: number, judge: boolean): void {
    if (this.closed) return;
    this.acceptAll();
    if (!judge) return;
    for (const g of [...this.greeting.values()]) if (now - g.since > this.timeoutMs) this.refuseGreeting(g, `no greeting within ${this.timeoutMs} ms`);
    for (const [key, inc] of [...this.incoming]) {
      if (now - inc.since <= this.timeoutMs) continue;
      this.refusals.refuse(inc.from, `connection ${key} did not complete within ${this.timeoutMs} ms`);
      this.drop(inc);
      this.incoming.delete(key);
    }
  }

  /** Takes every waiting connection, and reads the greetings already there. */
  private acceptAll(): void {
    while (!this.closed) {
      const a = this.io.binding.tcpAccept(this.fd);
      if (typeof a !== 'number') {
        this.greet(a.fd, a.from);
        continue;
      }
      if (a === EAGAIN) return;
      const e = dialError(a, 'accept');
      // Out of descriptors, the connection was closed (its connector fails at once, DROPPED).
      if (e.code === 'EMFILE' || e.code === 'ENFILE') this.refusals.refuse('a peer', `${sysMessage(e)}; the connection was closed`);
      else if (e.code !== 'ECONNABORTED' && e.code !== 'EINTR') log.warn(`listener on ${this.dev.name}: ${sysMessage(e)}`);
      return; // the watch calls again while connections wait
    }
  }

  private greet(fd: number, from: string): void {
    const g: Greeting = { fd, watch: 0, from, since: monoMs(), buf: Buffer.alloc(HELLO_BYTES + 64), have: 0 };
    try {
      g.watch = this.watches.watch(fd, false, () => this.readGreeting(g));
    } catch (e) {
      closeFd(fd);
      return this.refusals.refuse(from, sysMessage(e as Error));
    }
    this.greeting.set(fd, g);
    this.readGreeting(g); // it is usually there already
  }

  /**
   * Reads the greeting (HELLO_BYTES) greedily: a connector sends nothing after its greeting
   * before it has every ACK, so more bytes are a stranger's. Then the socket waits, unwatched,
   * with nothing read past the greeting, for the rest of its connection.
   */
  private readGreeting(g: Greeting): void {
    if (!this.greeting.has(g.fd)) return;
    while (g.have < g.buf.length) {
      const n = this.io.binding.fdRecv(g.fd, g.buf.subarray(g.have));
      if (n === EAGAIN) break;
      if (n === 0) return this.refuseGreeting(g, g.have >= HELLO_BYTES ? 'closed right after its greeting (its comm was closed before the ACK)' : 'closed before greeting');
      if (n < 0) return this.refuseGreeting(g, sysMessage(dialError(n, 'read')));
      g.have += n;
    }
    if (g.have < HELLO_BYTES) return;
    if (g.have > HELLO_BYTES) return this.refuseGreeting(g, `${g.have - HELLO_BYTES} unexpected bytes after the greeting`);
    this.greeting.delete(g.fd);
    this.watches.unwatch(g.watch);
    const h = decodeHello(g.buf.subarray(0, HELLO_BYTES));
    const refuse = (why: string) => this.refuseGreeting(g, why);
    if (typeof h === 'string') return refuse(h);
    if (!h.nonce.equals(this.nonce)) return refuse('wrong nonce (a stale handle or a stranger)');
    if (h.role === Role.ACK || h.lane > h.lanes) return refuse(`bad greeting (role ${h.role}, lane ${h.lane} of ${h.lanes})`);
    const key = h.connId.toString('hex');
    let inc = this.incoming.get(key);
    if (!inc) {
      inc = { fds: new Array(1 + h.lanes).fill(undefined), lanes: h.lanes, since: monoMs(), t0: performance.now(), from: g.from };
      this.incoming.set(key, inc);
    }
    const index = h.role === Role.CONTROL ? 0 : 1 + h.lane;
    if (h.lanes !== inc.lanes || index >= inc.fds.length || inc.fds[index] !== undefined) return refuse('greeting does not fit its connection');
    inc.fds[index] = g.fd;
    if (h.role === Role.CONTROL) inc.hello = h;
    if (inc.hello && inc.fds.every((x) => x !== undefined)) {
      this.incoming.delete(key);
      this.complete(inc, inc.hello);
    }
  }

  private refuseGreeting(g: Greeting, why: string): void {
    this.dropGreeting(g);
    this.refusals.refuse(g.from, why);
  }

  private dropGreeting(g: Greeting): void {
    this.greeting.delete(g.fd);
    this.watches.unwatch(g.watch);
    closeFd(g.fd);
  }

  private complete(inc: Incoming, h: Hello): void {
    const fds = inc.fds as number[];
    const [eager, stripes, laneChoice] = [byId(EAGER_POLICIES, h.policies[0]), byId(STRIPE_POLICIES, h.policies[1]), byId(LANE_POLICIES, h.policies[2])];
    if (!eager || !stripes || !laneChoice) {
      this.refusals.refuse(inc.from, `the sender asks for policies ${h.policies.join('/')}, which this tsnet does not know`);
      return this.drop(inc);
    }
    const policy: SchedulePolicy = { eagerMax: h.eagerMax, minStripe: h.minStripe, lanes: h.lanes, eager, stripes, laneChoice };
    // The engine takes the sockets first (it dups each: a process out of descriptors fails here,
    // and the connector, with no ACK, fails its connect), then the ACKs go, in the same turn:
    // nothing can be written on the link before them. A new socket has room for 48 bytes.
    const what = `${inc.from.replace(/:\d+$/, '')} -> ${this.dev.name}, ${h.lanes} data socket(s)`;
    let link: StreamLink;
    try {
      link = new NativeLink(this.io.port, this.io.binding, fds, policy, what, recvRingBytes(h.eagerMax));
    } catch (e) {
      log.warn(`listener on ${this.dev.name}: ${(e as Error).message}`);
      return this.drop(inc);
    }
    const ack = encodeHello({ ...h, role: Role.ACK, status: 0 });
    for (const fd of fds) {
      const w = this.io.binding.fdSend(fd, ack);
      if (w === ack.length) continue;
      const why = w < 0 ? sysMessage(dialError(w, 'write')) : `the ACK took ${w} of ${ack.length} bytes`;
      log.warn(`listener on ${this.dev.name}: a connection from ${inc.from} failed during its handshake: ${why}`);
      link.close(false);
      return this.drop(inc);
    }
    fds.forEach(closeFd); // the engine holds dups
    this.ready.push(link, inc.t0);
  }

  private drop(inc: Incoming): void {
    for (const fd of inc.fds) if (fd !== undefined) closeFd(fd);
    inc.fds.fill(undefined);
  }
}

class TcpConnector implements Connector {
  private readonly dials: Dial[] = [];
  private failed: NetError | undefined;
  private link: StreamLink | undefined;
  private taken = false;
  /** The comm NCCL took before the ACKs (TSNET_CONNECT_EARLY), until the link is made for it. */
  private early: EarlySend | undefined;
  /** When the connect began (monoMs), and whom it asks (for the timeout's words). */
  private readonly since = monoMs();
  readonly timing: ConnectTiming = { begun: performance.now() };
  private readonly to: string;
  private readonly nonce: Buffer;

  constructor(
    dev: NetDevice,
    handle: Uint8Array,
    private readonly policy: SchedulePolicy,
    private readonly io: TcpIo,
    watches: FdWatches,
    private readonly timeoutMs: number,
    private readonly earlyOk: boolean,
  ) {
    const h = decodeHandle(handle);
    this.to = `${h.rails[0].address}:${h.rails[0].port}`;
    this.nonce = h.nonce;
    const connId = randomBytes(8);
    const policies: [number, number, number] = [policy.eager.id, policy.stripes.id, policy.laneChoice.id];
    const base = { nonce: h.nonce, connId, lanes: policy.lanes, eagerMax: policy.eagerMax, minStripe: policy.minStripe, status: 0, policies };
    const multi = dev.nics.length > 1 || h.rails.length > 1;
    try {
      for (let i = 0; i <= policy.lanes; i++) {
        // Socket i rides rail i mod rails: a multi-NIC device spreads its sockets over its NICs.
        const rail = h.rails[i % h.rails.length];
        const nic = dev.nics[i % dev.nics.length];
        const greeting = encodeHello({ ...base, role: i === 0 ? Role.CONTROL : Role.DATA, lane: i === 0 ? 0 : i - 1 });
        this.dials.push(new Dial(io.binding, watches, closeFd, rail.address, rail.port, multi ? nic.address : undefined, greeting, () => this.advance()));
      }
    } catch (e) {
      this.dials.forEach((d) => d.dispose()); // a watch that could not be made: the sockets made so far go
      throw e;
    }
    this.advance(); // on loopback the connects are done already: the greetings go now
  }

  /**
   * The watchdog's tick: no answer within the timeout fails the connect. Not where judge is
   * false (the first tick after the thread was held: an answer that came meanwhile is read first).
   */
  tick(now: number, _timeoutMs: number, judge: boolean): void {
    this.advance();
    if (judge && now - this.since > this.timeoutMs) this.fail(systemError(`connect: no answer from ${this.to} within ${this.timeoutMs} ms`));
  }

  /**
   * The comm once ready. Its sockets' watches move the handshake on between calls, so a call
   * only looks: NCCL calls every pending connect in turn, and system calls in each call would
   * lengthen its rounds (docs/performance.md, item 43).
   */
  poll(hooks: CommHooks): SendComm | undefined {
    if (this.failed) throw this.failed;
    if (this.taken) return undefined;
    if (this.link) {
      this.taken = true;
      return sendComm(this.link, hooks);
    }
    // Early: every socket connected and greeted, as far as NCCL's Socket goes before it
    // gives its comm. What the listener answers reaches the comm (early.ts).
    if (!this.earlyOk || !this.dials.every((d) => d.greeted)) return undefined;
    this.taken = true;
    return (this.early = new EarlySend(hooks, this));
  }

  close(): void {
    this.dials.forEach((d) => d.dispose());
    if (!this.taken) this.link?.close(false); // once taken, the comm owns it (early: once attached)
  }

  /** Each socket's handshake as far as it goes now; the link once every one is answered. */
  private advance(): void {
    if (this.failed || this.link) return;
    let acked = 0;
    for (let i = 0; i < this.dials.length; i++) {
      const d = this.dials[i];
      const to = `${d.address}:${d.port}`;
      const s = d.step();
      if (s.kind === 'waiting') continue;
      if (s.kind === 'failed') return this.fail(systemError(`connect to ${to}: ${sysMessage(s.error)}`));
      if (s.kind === 'closed') {
        const how = s.error ? sysMessage(s.error) : `the listener closed socket ${i} before answering`;
        return this.fail(systemError(`connect to ${to}: ${how}${DROPPED}`));
      }
      const ack = decodeHello(s.answer);
      if (typeof ack === 'string') return this.fail(systemError(`connect to ${d.address}: ${ack}`));
      if (ack.role !== Role.ACK || !ack.nonce.equals(this.nonce) || ack.status !== 0)
        return this.fail(systemError(`connect to ${d.address}: the listener refused socket ${i} (status ${ack.status})`));
      acked++;
    }
    if (acked < this.dials.length) return;
    const to = this.to;
    try {
      const link = new NativeLink(this.io.port, this.io.binding, this.dials.map((d) => d.take()), this.policy, `-> ${to}, ${this.policy.lanes} data socket(s)`, SEND_RING_BYTES);
      this.dials.forEach((d) => d.dispose()); // the engine holds dups
      this.link = link;
      this.timing.ready = performance.now();
      this.timing.onReady?.(this.timing.ready);
    } catch (e) {
      return this.fail(e instanceof NetError ? e : systemError(`connect to ${to}: ${(e as Error).message}`));
    }
    const early = this.early;
    if (!early) return;
    // NCCL holds the comm already: the sends it posted meanwhile go now, outside a turn, so
    // their submissions are published here.
    early.attach(sendComm(this.link, early.hooks));
    this.io.port.flush();
  }

  private fail(err: NetError): void {
    if (this.failed || this.link) return;
    this.failed = err;
    this.dials.forEach((d) => d.dispose());
    this.early?.fail(err);
  }
}

export class TcpTransport implements Transport {
  readonly name = 'tcp';
  readonly traits = HOST_MEMORY_TRAITS;
  readonly devices: Device[];
  readonly policy: SchedulePolicy;
  private readonly netDevices: NetDevice[];
  private readonly timeoutMs: number;
  private readonly watches: FdWatches;
  private readonly connectEarly: boolean;

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
    this.connectEarly = config.connectEarly;
    this.watches = FdWatches.of(io.binding);
  }

  listen(dev: number): Listener {
    return new TcpListener(this.netDevices[dev], this.io, this.watches, this.timeoutMs);
  }

  connect(dev: number, handle: Uint8Array): Connector {
    return new TcpConnector(this.netDevices[dev], handle, this.policy, this.io, this.watches, this.timeoutMs, this.connectEarly);
  }

  poll(): void {
    this.io.port.poll();
  }

  flush(): boolean {
    this.io.port.flush();
    return this.io.port.backlog;
  }
}
