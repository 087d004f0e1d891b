/* Members of every versioned struct, written by hand from docs/ncclnet-abi.md (not generated),
 * as X-macros X(type, member). Used by layout.c and test/codegen/adapters.c. */
#pragma once

/* Scalar members of the properties struct per version (vProps is listed apart). */
#define PROPS_SCALARS_V6(X, T) X(T, name) X(T, pciPath) X(T, guid) X(T, ptrSupport) X(T, speed) \
  X(T, port) X(T, latency) X(T, maxComms) X(T, maxRecvs)
#define PROPS_SCALARS_V7(X, T) PROPS_SCALARS_V6(X, T) X(T, netDeviceType) X(T, netDeviceVersion)
#define PROPS_SCALARS_V8(X, T) PROPS_SCALARS_V7(X, T) X(T, regIsGlobal)
#define PROPS_SCALARS_V9(X, T) PROPS_SCALARS_V8(X, T) X(T, forceFlush) X(T, maxP2pBytes) X(T, maxCollBytes)
#define PROPS_SCALARS_V10(X, T) PROPS_SCALARS_V9(X, T)
#define PROPS_SCALARS_V11(X, T) PROPS_SCALARS_V10(X, T) X(T, maxMultiRequestSize)
#define PROPS_SCALARS_V12(X, T) PROPS_SCALARS_V11(X, T) X(T, railId) X(T, planeId)

/* Every member of the properties struct per version. */
#define PROPS_V6(X, T) PROPS_SCALARS_V6(X, T)
#define PROPS_V7(X, T) PROPS_SCALARS_V7(X, T)
#define PROPS_V8(X, T) PROPS_SCALARS_V8(X, T)
#define PROPS_V9(X, T) PROPS_SCALARS_V9(X, T) X(T, vProps)
#define PROPS_V10(X, T) PROPS_SCALARS_V10(X, T) X(T, vProps)
#define PROPS_V11(X, T) PROPS_SCALARS_V11(X, T) X(T, vProps)
#define PROPS_V12(X, T) PROPS_SCALARS_V12(X, T) X(T, vProps)

/* Slots of the function table per version. */
#define TABLE_V6(X, T) X(T, name) X(T, init) X(T, devices) X(T, getProperties) X(T, listen) X(T, connect) \
  X(T, accept) X(T, regMr) X(T, regMrDmaBuf) X(T, deregMr) X(T, isend) X(T, irecv) X(T, iflush) X(T, test) \
  X(T, closeSend) X(T, closeRecv) X(T, closeListen)
#define TABLE_V7(X, T) TABLE_V6(X, T) X(T, getDeviceMr) X(T, irecvConsumed)
#define TABLE_V8(X, T) TABLE_V7(X, T)
#define TABLE_V9(X, T) TABLE_V8(X, T) X(T, makeVDevice)
#define TABLE_V10(X, T) TABLE_V9(X, T)
#define TABLE_V11(X, T) TABLE_V10(X, T) X(T, finalize) X(T, setNetAttr)
#define TABLE_V12(X, T) TABLE_V11(X, T)

/* The other structs. */
#define VPROPS(X, T) X(T, ndevs) X(T, devs)
#define COMM_CONFIG(X, T) X(T, trafficClass)
#define DEV_HANDLE(X, T) X(T, type) X(T, version) X(T, handle) X(T, size) X(T, needsProxyProgress)
#define NET_ATTR_PEERS(X, T) X(T, maxConcurrentPeers) X(T, minConcurrentPeers) X(T, maxFlowsPerPeer) X(T, minFlowsPerPeer)
#define NET_ATTR(X, T) X(T, send) X(T, recv) X(T, op) X(T, algo) X(T, proto)
