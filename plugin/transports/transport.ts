// A transport: its devices, what its devices can do (one description, so properties are
// values, not code paths), and how links are made.
import { PtrKind } from '../abi';
import type { SchedulePolicy } from '../protocol/schedule';
import type { Link } from './lane';

/** A network device as NCCL sees it. */
export interface Device {
  /** Unique name; NCCL's topology key. */
  name: string;
  /** realpath of the NIC's PCI device in /sys, or null for a virtual NIC. */
  pciPath: string | null;
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

export interface Listener {
  /** The bytes NCCL carries to the peer (at most 128). */
  readonly handle: Uint8Array;
  /** A link a peer connected, or undefined while none is ready. Throws on failure. */
  accept(): Link | undefined;
  close(): void;
}

export interface Connector {
  /** The link once it is up, or undefined while not yet. Throws (NetError) on failure. */
  poll(): Link | undefined;
  close(): void;
}

export interface Transport {
  readonly name: string;
  readonly traits: Traits;
  readonly devices: readonly Device[];
  listen(dev: number): Listener;
  connect(dev: number, handle: Uint8Array): Connector;
  /** The schedule both ends of a new link use. */
  readonly policy: SchedulePolicy;
}
