// A transport: its devices, what its devices can do (one description, so properties are
// values, not code paths), and how links are made.
import { PtrKind } from '../abi';
import type { NetError } from '../errors';
import type { Region } from '../memory';
import type { CommStats, Complete, RequestTrace } from '../protocol/endpoint';
import type { RecvArgs } from '../protocol/receiver';

/** A network device as NCCL sees it. */
export interface Device {
  /** Unique name; NCCL's topology key. */
  name: string;
  /** realpath of the NIC's PCI device in /sys, or null for a virtual NIC. */
  pciPath: string | null;
  /** Distinct per NIC, the same in every process of a host (plugin/transports/guid.ts). */
  guid: bigint;
  /** Link speed in Mbps. */
  speedMbps: number;
  /** Physical NICs behind this device (rails); one for a plain device. */
  rails: number;
}

/** What every device of a transport can do. */
export interface Traits {
  /** PtrKind bits regMr accepts. */
  ptrSupport: number;
  /** Largest n in one irecv. */
  maxRecvs: number;
  /** A registration serves every comm. */
  regIsGlobal: boolean;
  /** NCCL must flush every GPU receive. */
  forceFlush: boolean;
  /** Channels NCCL may open on a device. */
  maxComms: number;
  /** µs added to NCCL's latency estimate. */
  latencyUs: number;
  /** Largest single point-to-point and collective transfer. */
  maxP2pBytes: number;
  maxCollBytes: number;
}

/**
 * A transport over host memory (NCCL stages GPU data in host buffers for it): grouped
 * receives of up to 8, no flush, transfers up to 1 GiB (a power of two that fits the int
 * sizes of older ABI versions).
 */
export const HOST_MEMORY_TRAITS: Traits = {
  ptrSupport: PtrKind.HOST,
  maxRecvs: 8,
  regIsGlobal: false,
  forceFlush: false,
  maxComms: 65536,
  latencyUs: 0,
  maxP2pBytes: 1 << 30,
  maxCollBytes: 1 << 30,
};

/** What the plugin gives a transport to make a comm with. */
export interface CommHooks {
  /** Ends a request of the comm (plugin.ts writes its slot state). */
  complete: Complete;
  /** For log lines: "comm 7". */
  name: string;
}

/** What every comm does, either side. */
export interface CommBase {
  readonly pending: number;
  readonly stats: CommStats;
  trace: RequestTrace | undefined;
  /** Starts taking the transport's events (after the plugin has registered the comm). */
  start(): void;
  /** Periodic: liveness; judge: whether silence may fail it now (false at the watchdog's first tick after the thread was held). */
  tick(now: number, timeoutMs: number, judge?: boolean): void;
  /** Closes it; requests in flight are cancelled and their memory never touched again. */
  close(): void;
  fail(err: NetError): void;
  /** Requests using region end with an error now and never touch it again; returns how many. */
  cancelRegion(region: Region): number;
}

export interface SendComm extends CommBase {
  isend(slot: number, region: Region | null, offset: number, size: number, tag: number): void;
}

export interface RecvComm extends CommBase {
  irecv(slot: number, args: RecvArgs): void;
  iflush(slot: number, args: RecvArgs): void;
}

export interface Listener {
  /** The bytes NCCL carries to the peer (at most 128). */
  readonly handle: Uint8Array;
  /** A comm a peer connected, or undefined while none is ready. Throws on failure. */
  accept(hooks: CommHooks): RecvComm | undefined;
  /**
   * Where the transport times its handshakes: for the comm accept just returned, µs from the
   * connection's first message (TCP: greeting; libfabric: CONNECT) to ready for accept, and
   * from ready to that call (TSNET_STATS).
   */
  readonly lastAccept?: { handshakeUs: number; waitedUs: number };
  close(): void;
  /** Periodic (the watchdog): connections that are not complete in time are dropped, only where judge (Transport.tick). */
  tick?(now: number, timeoutMs: number, judge: boolean): void;
}

/**
 * A listener's comms ready for accept, in order, and how long each one's handshake took: for
 * the one shift() last gave, from the handshake's start to ready, and from ready to that call
 * (µs; Listener.lastAccept, TSNET_STATS).
 */
export class AcceptQueue<T> {
  private readonly items: { item: T; handshakeUs: number; at: number }[] = [];
  lastAccept: { handshakeUs: number; waitedUs: number } | undefined;

  /** item is ready; its handshake began at t0 (performance.now(), ms). */
  push(item: T, t0: number): void {
    const at = performance.now();
    this.items.push({ item, handshakeUs: (at - t0) * 1000, at });
  }

  shift(): T | undefined {
    const r = this.items.shift();
    if (!r) return undefined;
    this.lastAccept = { handshakeUs: r.handshakeUs, waitedUs: (performance.now() - r.at) * 1000 };
    return r.item;
  }

  get length(): number {
    return this.items.length;
  }

  /** Every one still waiting, taken out (a listener that closes). */
  drain(): T[] {
    return this.items.splice(0).map((r) => r.item);
  }
}

/**
 * Where a transport times its handshake: performance.now() (ms) when the connector began and
 * when its comm was ready, set once ready (TSNET_STATS). A comm given before it was ready
 * (TSNET_CONNECT_EARLY) has no ready yet: onReady, where set, is called with it.
 */
export interface ConnectTiming {
  begun: number;
  ready?: number;
  onReady?: (ready: number) => void;
}

export interface Connector {
  /**
   * The comm once it is up (or, where the transport allows it, once the peer has all it needs
   * to accept: its sends wait until then), or undefined while not yet. Throws (NetError) on
   * failure.
   */
  poll(hooks: CommHooks): SendComm | undefined;
  readonly timing?: ConnectTiming;
  close(): void;
  /** Periodic (the watchdog): no answer in time fails the connect, only where judge (Transport.tick). */
  tick?(now: number, timeoutMs: number, judge: boolean): void;
}

export interface Transport {
  readonly name: string;
  readonly traits: Traits;
  readonly devices: readonly Device[];
  listen(dev: number): Listener;
  connect(dev: number, handle: Uint8Array): Connector;
  /** Hands completions that wait to their comms (a protocol thread's turn). */
  poll(): void;
  /** Publishes the turn's submissions; true while some still wait for room in a full ring. */
  flush(): boolean;
  /** Registers a region with the device's NICs (transports whose peers address memory: libfabric). */
  register?(region: Region, dev: number): void;
  deregister?(region: Region, dev: number): void;
  /** Periodic, per thread: liveness of comms the transport ticks itself. */
  tick?(now: number, timeoutMs: number, judge?: boolean): void;
  /**
   * The thread has no context, comm or listener left (the last finalize): resources the
   * transport opened lazily go (libfabric endpoints: shm's leave a region in /dev/shm
   * behind when the process ends with _exit). The next listen or connect opens them again.
   */
  release?(): void;
}
