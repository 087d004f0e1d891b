// The TCP transport. A comm is one control socket plus N data sockets; listen fills the
// handle with the device's addresses, a port and a random nonce; connect/accept are
// non-blocking state machines that NCCL's retries drive. Every new socket greets with a
// HELLO (magic, protocol version, nonce, connection id) and is refused with a WARN
// otherwise, so a stranger on the port never becomes a comm nor breaks the listener.
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import type { Config } from '../../config';
import { NetError, systemError } from '../../errors';
import { log } from '../../log';
import type { SchedulePolicy } from '../../protocol/schedule';
import { type Lane, LaneLink, type Link } from '../lane';
import { type Connector, type Device, HOST_MEMORY_TRAITS, type Listener, type Transport } from '../transport';
import { type NetDevice, discoverDevices } from './devices';
import { NodeLane } from './node-lane';
import { HELLO_BYTES, type Hello, Role, decodeHandle, decodeHello, encodeHandle, encodeHello } from './wire';

/** Turns a greeted, paused socket into a lane (index 0 is the control lane; the native I/O lanes plug in here). */
export type LaneMaker = (sock: net.Socket, onFail: (err: Error) => void, index: number) => Lane;

export const nodeLanes: LaneMaker = (sock, onFail) => new NodeLane(sock, onFail);

/** Reads the 40-byte greeting, then leaves the socket paused with nothing buffered. */
function readHello(sock: net.Socket, timeoutMs: number, cb: (err: Error | undefined, h?: Hello) => void): void {
  const parts: Buffer[] = [];
  let have = 0;
  const finish = (err?: Error, h?: Hello) => {
    sock.removeListener('data', onData);
    sock.removeListener('error', onError);
    sock.removeListener('end', onEnd);
    sock.setTimeout(0);
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
  sock.setTimeout(timeoutMs, () => finish(new Error(`no greeting within ${timeoutMs} ms`)));
}

interface Incoming {
  hello?: Hello; // the control socket's
  socks: (net.Socket | undefined)[];
  lanes: number;
  timer: NodeJS.Timeout;
}

class TcpListener implements Listener {
  readonly handle: Uint8Array;
  private readonly server: net.Server;
  private readonly nonce = randomBytes(8);
  private readonly incoming = new Map<string, Incoming>();
  private readonly ready: Link[] = [];
  private closed = false;

  constructor(
    private readonly dev: NetDevice,
    private readonly makeLane: LaneMaker,
    private readonly timeoutMs: number,
  ) {
    this.server = net.createServer((s) => this.greet(s));
    this.server.on('error', (e) => log.warn(`listener on ${dev.name}: ${e.message}`));
    // Bound synchronously (no host name lookup), on every address: the handle names the device's.
    this.server.listen({ port: 0, host: undefined, ipv6Only: false, backlog: 1024 });
    const port = (this.server.address() as net.AddressInfo).port;
    this.handle = encodeHandle({
      nonce: this.nonce,
      rails: dev.nics.map((n) => ({ family: n.family, address: n.address, port })),
    });
  }

  accept(): Link | undefined {
    return this.ready.shift();
  }

  close(): void {
    this.closed = true;
    this.server.close();
    for (const inc of this.incoming.values()) this.drop(inc);
    this.incoming.clear();
    this.ready.splice(0).forEach((l) => l.close());
  }

  private greet(s: net.Socket): void {
    s.setNoDelay(true);
    const from = `${s.remoteAddress}:${s.remotePort}`;
    readHello(s, this.timeoutMs, (err, h) => {
      if (this.closed) return s.destroy();
      const refuse = (why: string) => {
        log.warn(`listener on ${this.dev.name}: refused a connection from ${from}: ${why}`);
        s.destroy();
      };
      if (err || !h) return refuse(err?.message ?? 'no greeting');
      if (!h.nonce.equals(this.nonce)) return refuse('wrong nonce (a stale handle or a stranger)');
      if (h.role === Role.ACK || h.lanes > 64 || h.lane > h.lanes) return refuse(`bad greeting (role ${h.role}, lane ${h.lane} of ${h.lanes})`);
      const key = h.connId.toString('hex');
      let inc = this.incoming.get(key);
      if (!inc) {
        inc = {
          socks: new Array(1 + h.lanes).fill(undefined),
          lanes: h.lanes,
          timer: setTimeout(() => {
            log.warn(`listener on ${this.dev.name}: connection ${key} did not complete within ${this.timeoutMs} ms`);
            this.drop(this.incoming.get(key));
            this.incoming.delete(key);
          }, this.timeoutMs),
        };
        this.incoming.set(key, inc);
      }
      const index = h.role === Role.CONTROL ? 0 : 1 + h.lane;
      if (h.lanes !== inc.lanes || index >= inc.socks.length || inc.socks[index]) return refuse('greeting does not fit its connection');
      inc.socks[index] = s;
      if (h.role === Role.CONTROL) inc.hello = h;
      if (inc.hello && inc.socks.every(Boolean)) {
        clearTimeout(inc.timer);
        this.incoming.delete(key);
        this.complete(inc, inc.hello);
      }
    });
  }

  private complete(inc: Incoming, h: Hello): void {
    const socks = inc.socks as net.Socket[];
    const policy = { eagerMax: h.eagerMax, minStripe: h.minStripe, lanes: h.lanes };
    const link = new LaneLink((fail) => socks.map((s, i) => this.makeLane(s, fail, i)), `${socks[0].remoteAddress} -> ${this.dev.name}, ${h.lanes} data socket(s)`, policy);
    // The ACK travels through the lanes themselves: nothing read from here on is lost.
    const ack = encodeHello({ ...h, role: Role.ACK, status: 0 });
    [link.control, ...link.data].forEach((l) => l.write([ack], () => {}));
    this.ready.push(link);
  }

  private drop(inc: Incoming | undefined): void {
    if (!inc) return;
    clearTimeout(inc.timer);
    inc.socks.forEach((s) => s?.destroy());
  }
}

class TcpConnector implements Connector {
  private readonly socks: net.Socket[] = [];
  private acked = 0;
  private failed: NetError | undefined;
  private link: Link | undefined;
  private readonly timer: NodeJS.Timeout;

  constructor(
    dev: NetDevice,
    handle: Uint8Array,
    private readonly policy: SchedulePolicy,
    private readonly makeLane: LaneMaker,
    timeoutMs: number,
  ) {
    const h = decodeHandle(handle);
    const connId = randomBytes(8);
    const base = { nonce: h.nonce, connId, lanes: policy.lanes, eagerMax: policy.eagerMax, minStripe: policy.minStripe, status: 0 };
    const multi = dev.nics.length > 1 || h.rails.length > 1;
    for (let i = 0; i <= policy.lanes; i++) {
      // Socket i rides rail i mod rails: a multi-NIC device spreads its sockets over its NICs.
      const rail = h.rails[i % h.rails.length];
      const nic = dev.nics[i % dev.nics.length];
      const s = net.connect({ host: rail.address, port: rail.port, localAddress: multi ? nic.address : undefined });
      s.setNoDelay(true);
      const greeting = encodeHello({ ...base, role: i === 0 ? Role.CONTROL : Role.DATA, lane: i === 0 ? 0 : i - 1 });
      s.on('connect', () => {
        s.write(greeting);
        readHello(s, timeoutMs, (err, ack) => this.onAck(i, rail.address, err, ack, h.nonce));
      });
      s.on('error', (e) => this.fail(systemError(`connect to ${rail.address}:${rail.port}: ${e.message}`)));
      this.socks.push(s);
    }
    this.timer = setTimeout(() => this.fail(systemError(`connect: no answer from ${h.rails[0].address}:${h.rails[0].port} within ${timeoutMs} ms`)), timeoutMs);
  }

  poll(): Link | undefined {
    if (this.failed) throw this.failed;
    return this.link;
  }

  close(): void {
    clearTimeout(this.timer);
    this.socks.forEach((s) => s.destroy());
    this.link?.close();
  }

  private onAck(i: number, addr: string, err: Error | undefined, ack: Hello | undefined, nonce: Buffer): void {
    if (this.failed) return;
    if (err || !ack) return this.fail(systemError(`connect to ${addr}: ${err?.message ?? 'no answer'}`));
    if (ack.role !== Role.ACK || !ack.nonce.equals(nonce) || ack.status !== 0)
      return this.fail(systemError(`connect to ${addr}: the listener refused socket ${i} (status ${ack.status})`));
    if (++this.acked < this.socks.length) return;
    clearTimeout(this.timer);
    for (const s of this.socks) s.removeAllListeners('error');
    const to = `${this.socks[0].remoteAddress}:${this.socks[0].remotePort}`;
    this.link = new LaneLink((fail) => this.socks.map((s, i) => this.makeLane(s, fail, i)), `-> ${to}, ${this.policy.lanes} data socket(s)`, this.policy);
  }

  private fail(err: NetError): void {
    if (this.failed || this.link) return;
    this.failed = err;
    clearTimeout(this.timer);
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
    private readonly makeLane: LaneMaker = nodeLanes,
    discovered?: NetDevice[],
  ) {
    this.netDevices = discovered ?? discoverDevices({ ifname: config.socketIfname, family: config.socketFamily, groups: config.deviceGroups });
    if (this.netDevices.length === 0)
      throw systemError(`no usable network interface${config.socketIfname ? ` matches NCCL_SOCKET_IFNAME=${config.socketIfname}` : ''}`);
    this.devices = this.netDevices.map((d) => ({ name: d.name, pciPath: d.pciPath, speedMbps: d.speedMbps, rails: d.nics.length }));
    for (const d of this.netDevices) log.info(`device ${d.name}: ${d.nics.map((n) => `${n.name} ${n.address}`).join(', ')}, ${d.speedMbps} Mbps`);
    this.policy = { eagerMax: config.eagerMax, minStripe: config.minStripe, lanes: config.nsocks };
    this.timeoutMs = config.timeoutSec * 1000;
  }

  listen(dev: number): Listener {
    return new TcpListener(this.netDevices[dev], this.makeLane, this.timeoutMs);
  }

  connect(dev: number, handle: Uint8Array): Connector {
    return new TcpConnector(this.netDevices[dev], handle, this.policy, this.makeLane, this.timeoutMs);
  }
}
