// Constants of the ABI. Each enum becomes C #defines named `@cprefix` + member.

/** ncclResult_t codes. @cprefix TSN_ */
export enum ResultCode {
  /** The call succeeded. */
  SUCCESS = 0,
  /** A CUDA call failed. */
  UNHANDLED_CUDA_ERROR = 1,
  /** A network or OS call failed. */
  SYSTEM_ERROR = 2,
  /** NCCL misused the plugin or the plugin failed itself. */
  INTERNAL_ERROR = 3,
  /** An argument is out of range. */
  INVALID_ARGUMENT = 4,
  /** The user asked for something impossible (e.g. a size mismatch). */
  INVALID_USAGE = 5,
  /** The peer failed. */
  REMOTE_ERROR = 6,
}

/** Sizes and limits of the ABI. @cprefix TSN_ */
export enum Limits {
  /** Bytes of the handle listen fills and connect reads. */
  HANDLE_SIZE = 128,
  /** Requests in flight per comm (send side: this times maxRecvs). */
  MAX_REQUESTS = 32,
  /** Largest maxRecvs: buffers in one irecv. */
  MAX_RECVS = 8,
  /** Largest maxP2pBytes / maxCollBytes: 2^40 bytes (1 TiB). */
  MAX_TRANSFER_BYTES = 1099511627776,
  /** railId / planeId / trafficClass value meaning unset. */
  UNSET = -1,
  /** The ctx v6-v10 pass to the core's init, as (void**)TSN_NO_CTX: they have no context (NULL from v11+ is an error). */
  NO_CTX = 1,
}

/** Pointer kinds for ptrSupport and regMr's type (bits). @cprefix TSN_PTR_ */
export enum PtrKind {
  /** Host memory. */
  HOST = 0x1,
  /** CUDA device memory. */
  CUDA = 0x2,
  /** Memory registered through a dma-buf fd. */
  DMABUF = 0x4,
}

/** Values of netDeviceType. @cprefix TSN_NET_DEVICE_ */
export enum NetDeviceType {
  /** A host-driven network device; the only kind tsnet reports. */
  HOST = 0,
}

/** Levels of NCCL's logger. @cprefix TSN_LOG_ */
export enum LogLevel {
  /** No output. */
  NONE = 0,
  /** The version banner. */
  VERSION = 1,
  /** Warnings. */
  WARN = 2,
  /** Information. */
  INFO = 3,
  /** Fatal errors. */
  ABORT = 4,
  /** Tracing. */
  TRACE = 5,
}

/** Logger subsystem flags. @cprefix TSN_LOG_ */
export enum LogSubsys {
  /** Initialization. */
  INIT = 1,
  /** Networking: every tsnet log line. */
  NET = 16,
}

/** Kinds of the tsn_props_t field descriptors. @cprefix TSN_FIELD_ */
export enum FieldKind {
  /** A char* member. */
  STRING = 1,
  /** An int16_t member. */
  I16 = 2,
  /** An int member. */
  I32 = 3,
  /** A uint64_t member. */
  U64 = 4,
  /** A size_t member. */
  SIZE = 5,
  /** A float member. */
  F32 = 6,
  /** The vProps {ndevs, devs[]} member. */
  VPROPS = 7,
}
