// ncclNet_vN_t: one interface, slots in table order. A slot whose signature
// changed across versions is a set of overloads, each tagged `@versions`; the
// overload tagged `@core` is the version-neutral tsn_<slot> the native core
// implements. `@absent` lists versions whose table lacks the slot;
// `@unimplemented` slots are NULL in tsnet's tables.
import type { Logger, Profiler, Result } from './callbacks';
import type { Const, ConstCStr, I32, Ptr, Size, U64 } from './ctypes';
import type { NetProperties, VirtualProps } from './properties';
import type { CommConfig, DevHandle, NetAttr } from './structs';

/** A network plugin's function table. @cname tsn_net @export ncclNetPlugin */
export interface NetPlugin {
  /** Name NCCL matches against NCCL_NET. @versions 6.. @value tsnet */
  name: ConstCStr;

  /** Initializes the plugin. @versions 6..9 */
  init(logger: Logger): Result;
  /** Initializes the plugin with a profiler. @versions 10 */
  init(logger: Logger, prof: Profiler): Result;
  /** Creates a context per communicator; same commId on all its ranks. @versions 11.. */
  init(ctx: Ptr<Ptr<void>>, commId: U64, config: Ptr<CommConfig>, logger: Logger, prof: Profiler): Result;
  /** Core: ctx (void**)TSN_NO_CTX (v6-v10) means the process-wide legacy context; a NULL ctx is an error. @core @fill ctx (void**)TSN_NO_CTX */
  init(ctx: Ptr<Ptr<void>>, commId: U64, config: Ptr<Const<CommConfig>>, logger: Logger, prof: Profiler): Result;

  /** Reports the number of devices (> 0). @versions 6.. @core */
  devices(ndev: Ptr<I32>): Result;

  /** Fills a device's properties (the core fills the neutral tsn_props_t). @versions 6.. @core */
  getProperties(dev: I32, props: Ptr<NetProperties>): Result;

  /** Listens on a device and fills the 128-byte handle. @versions 6..10 */
  listen(dev: I32, handle: Ptr<void>, listenComm: Ptr<Ptr<void>>): Result;
  /** Listens within a context. @versions 11.. @core */
  listen(ctx: Ptr<void>, dev: I32, handle: Ptr<void>, listenComm: Ptr<Ptr<void>>): Result;

  /** Connects to a listener's handle; NULL comm = not yet. @versions 6 */
  connect(dev: I32, handle: Ptr<void>, sendComm: Ptr<Ptr<void>>): Result;
  /** Connects, with a device handle. @versions 7..9 */
  connect(dev: I32, handle: Ptr<void>, sendComm: Ptr<Ptr<void>>, sendDevComm: Ptr<Ptr<DevHandle>>): Result;
  /** Connects with the comm's config. @versions 10 */
  connect(dev: I32, config: Ptr<CommConfig>, handle: Ptr<void>, sendComm: Ptr<Ptr<void>>, sendDevComm: Ptr<Ptr<DevHandle>>): Result;
  /** Connects within a context. @versions 11.. */
  connect(ctx: Ptr<void>, dev: I32, handle: Ptr<void>, sendComm: Ptr<Ptr<void>>, sendDevComm: Ptr<Ptr<DevHandle>>): Result;
  /** Core: NULL config = the context's. @core */
  connect(ctx: Ptr<void>, dev: I32, config: Ptr<Const<CommConfig>>, handle: Ptr<void>, sendComm: Ptr<Ptr<void>>, sendDevComm: Ptr<Ptr<DevHandle>>): Result;

  /** Accepts a connection; NULL comm = not yet. @versions 6 */
  accept(listenComm: Ptr<void>, recvComm: Ptr<Ptr<void>>): Result;
  /** Accepts, with a device handle. @versions 7.. @core */
  accept(listenComm: Ptr<void>, recvComm: Ptr<Ptr<void>>, recvDevComm: Ptr<Ptr<DevHandle>>): Result;

  /** Registers memory with an int size. @versions 6..7 */
  regMr(comm: Ptr<void>, data: Ptr<void>, size: I32, type: I32, mhandle: Ptr<Ptr<void>>): Result;
  /** Registers memory (type: a PtrKind). @versions 8.. @core */
  regMr(comm: Ptr<void>, data: Ptr<void>, size: Size, type: I32, mhandle: Ptr<Ptr<void>>): Result;

  /** Registers memory through a DMA-BUF fd (offset: the region's within it). @versions 6.. @core */
  regMrDmaBuf(comm: Ptr<void>, data: Ptr<void>, size: Size, type: I32, offset: U64, fd: I32, mhandle: Ptr<Ptr<void>>): Result;

  /** Deregisters memory. @versions 6.. @core */
  deregMr(comm: Ptr<void>, mhandle: Ptr<void>): Result;

  /** Posts a send with an int size; NULL request = try later. @versions 6..8 */
  isend(sendComm: Ptr<void>, data: Ptr<void>, size: I32, tag: I32, mhandle: Ptr<void>, request: Ptr<Ptr<void>>): Result;
  /** Posts a send. @versions 9 */
  isend(sendComm: Ptr<void>, data: Ptr<void>, size: Size, tag: I32, mhandle: Ptr<void>, request: Ptr<Ptr<void>>): Result;
  /** Posts a send with a profiler handle. @versions 10.. @core */
  isend(sendComm: Ptr<void>, data: Ptr<void>, size: Size, tag: I32, mhandle: Ptr<void>, phandle: Ptr<void>, request: Ptr<Ptr<void>>): Result;

  /** Posts n receives with int sizes. @versions 6..8 */
  irecv(recvComm: Ptr<void>, n: I32, data: Ptr<Ptr<void>>, sizes: Ptr<I32>, tags: Ptr<I32>, mhandles: Ptr<Ptr<void>>, request: Ptr<Ptr<void>>): Result;
  /** Posts n receives. @versions 9 */
  irecv(recvComm: Ptr<void>, n: I32, data: Ptr<Ptr<void>>, sizes: Ptr<Size>, tags: Ptr<I32>, mhandles: Ptr<Ptr<void>>, request: Ptr<Ptr<void>>): Result;
  /** Posts n receives with profiler handles. @versions 10.. */
  irecv(recvComm: Ptr<void>, n: I32, data: Ptr<Ptr<void>>, sizes: Ptr<Size>, tags: Ptr<I32>, mhandles: Ptr<Ptr<void>>, phandles: Ptr<Ptr<void>>, request: Ptr<Ptr<void>>): Result;
  /** Core: sizes has n entries, n ≤ MAX_RECVS. @core @count sizes n MAX_RECVS */
  irecv(recvComm: Ptr<void>, n: I32, data: Ptr<Ptr<void>>, sizes: Ptr<Const<Size>>, tags: Ptr<I32>, mhandles: Ptr<Ptr<void>>, phandles: Ptr<Ptr<void>>, request: Ptr<Ptr<void>>): Result;

  /** Flushes received GPU data. @versions 6.. @core */
  iflush(recvComm: Ptr<void>, n: I32, data: Ptr<Ptr<void>>, sizes: Ptr<I32>, mhandles: Ptr<Ptr<void>>, request: Ptr<Ptr<void>>): Result;

  /** Tests a request; sizes gets n ints for irecv, one for isend. @versions 6.. @core */
  test(request: Ptr<void>, done: Ptr<I32>, sizes: Ptr<I32>): Result;

  /** Closes a send comm. @versions 6.. @core */
  closeSend(sendComm: Ptr<void>): Result;
  /** Closes a receive comm. @versions 6.. @core */
  closeRecv(recvComm: Ptr<void>): Result;
  /** Closes a listen comm. @versions 6.. @core */
  closeListen(listenComm: Ptr<void>): Result;

  /** Device pointer of a registration. @absent 6 @versions 7.. @unimplemented */
  getDeviceMr(comm: Ptr<void>, mhandle: Ptr<void>, dptr: Ptr<Ptr<void>>): Result;
  /** Returns consumed receive buffers. @absent 6 @versions 7.. @unimplemented */
  irecvConsumed(recvComm: Ptr<void>, n: I32, request: Ptr<void>): Result;
  /** Makes a virtual device. @absent 6..8 @versions 9.. @unimplemented */
  makeVDevice(d: Ptr<I32>, props: Ptr<VirtualProps>): Result;

  /** Releases a context's comms. @absent 6..10 @versions 11.. @core */
  finalize(ctx: Ptr<void>): Result;
  /** Network hints for a context. @absent 6..10 @versions 11.. */
  setNetAttr(ctx: Ptr<void>, attr: Ptr<NetAttr>): Result;
  /** Core: read-only hints. @core */
  setNetAttr(ctx: Ptr<void>, attr: Ptr<Const<NetAttr>>): Result;
}
