// Structs passed through the function table, other than the properties.
import type { I32, Ptr, Size, U32 } from './ctypes';

/** Per-communicator network settings (v10+). @cname tsn_comm_config */
export interface CommConfig {
  /** Traffic class for the comm's connections; -1 = unset. */
  trafficClass: I32;
}

/** Device-side handle of a comm (v7+); a host plugin leaves it alone. @cname tsn_dev_handle */
export interface DevHandle {
  /** NetDeviceType of the handle. */
  type: I32;
  /** Version of the device code. */
  version: I32;
  /** Device-side state. */
  handle: Ptr<void>;
  /** Bytes at handle. */
  size: Size;
  /** The device code needs the proxy to call progress. */
  needsProxyProgress: I32;
}

/** Peer and flow hints for one direction (part of NetAttr). @cname tsn_net_attr_peers */
export interface NetAttrPeers {
  /** Most peers talked to at once. */
  maxConcurrentPeers: I32;
  /** Fewest peers talked to at once. */
  minConcurrentPeers: I32;
  /** Most flows per peer. */
  maxFlowsPerPeer: I32;
  /** Fewest flows per peer. */
  minFlowsPerPeer: I32;
}

/** Hints NCCL passes to setNetAttr (v11+). @cname tsn_net_attr */
export interface NetAttr {
  /** Send-side hints. */
  send: NetAttrPeers;
  /** Receive-side hints. */
  recv: NetAttrPeers;
  /** Bitmask of collective operations. */
  op: U32;
  /** Bitmask of algorithms. */
  algo: U32;
  /** Bitmask of protocols. */
  proto: U32;
}
