// The `tsnet` binding: what the plugin's JavaScript sees of native memory and of NCCL, and
// the calls the core makes into the plugin. Each protocol thread has its own instance; every
// js* call runs on the protocol thread that owns what it names.
#pragma once
#include <node_api.h>

#include <cstdint>

#include "internal.h"

namespace tsn {

// Calls fn(argv) through napi_make_callback (microtasks and nextTicks run after it). An
// exception is cleared and becomes a WARN naming `what`; the answer is then false.
bool callPlugin(napi_env env, napi_async_context async, napi_value fn, const char* what, size_t argc,
                const napi_value* argv, napi_value* result);

// Registers the binding's functions (process._linkedBinding('tsnet')).
napi_value bindingInit(napi_env env, napi_value exports);
// The protocol thread the calling thread is (-1 for any other thread).
void bindingSetThread(int index);
int bindingThreadIndex();

// Control calls into the plugin. Each returns the plugin's result code; a JavaScript
// exception becomes an internal error with a WARN naming it.
tsn_result_t jsInit(uint64_t commId, int trafficClass, bool legacy, uint32_t* ctxId, int* warmup);
tsn_result_t jsDevices(int* ndev);
tsn_result_t jsGetProperties(int dev, tsn_props_t* props);
tsn_result_t jsListen(uint32_t ctxId, int dev, void* handle, uint32_t* listenId);
// connect/accept answer *commId = 0 while the connection is not up yet.
tsn_result_t jsConnect(uint32_t ctxId, int dev, int trafficClass, const void* handle, uint32_t* commId);
tsn_result_t jsAccept(uint32_t listenId, uint32_t* commId);
// A new comm's slot states are shared with the plugin.
tsn_result_t jsAttachComm(Comm* comm);
// fd >= 0: regMrDmaBuf, the region is the DMA-BUF fd's bytes from offset (valid during the call).
tsn_result_t jsRegMr(Comm* comm, void* data, size_t size, int type, Mr* mr, int fd = -1, uint64_t offset = 0);
tsn_result_t jsDeregMr(Comm* comm, Mr* mr);
tsn_result_t jsCloseComm(Comm* comm);
tsn_result_t jsCloseListen(uint32_t listenId);
tsn_result_t jsFinalize(uint32_t ctxId);
tsn_result_t jsSetNetAttr(uint32_t ctxId, const tsn_net_attr_t* attr);

// Something happened on the calling protocol thread: keeps its busy-poll window open.
void markActivity();
// Wakes protocol thread `thread` unless it polls (its busy-poll window is open). Any thread.
void pluginWake(int thread);
// The calling protocol thread's event loop watches fd (an epoll set of early wake-ups): when it
// turns readable the thread takes its events and opens its busy-poll window. False where the
// thread has no loop (the tests' engine addon) or no busy-poll window.
bool pluginWatchFd(int fd);
// Protocol thread `thread`'s wake-up state, for a WARN (any thread); false when it has no plugin.
bool pluginWakeState(int thread, bool* spinning, bool* pending, bool* readable);

// TSNET_TRACE: timestamps are taken (any thread), in CLOCK_MONOTONIC microseconds.
bool tracing();
double traceNowUs();

}  // namespace tsn
