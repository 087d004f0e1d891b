// The `tsnet` binding: what the plugin's JavaScript sees of native memory and of NCCL, and
// the calls the core makes into the plugin. Everything here runs on the plugin thread.
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

// Control calls into the plugin. Each returns the plugin's result code; a JavaScript
// exception becomes an internal error with a WARN naming it.
tsn_result_t jsInit(uint64_t commId, int trafficClass, bool legacy, uint32_t* ctxId);
tsn_result_t jsDevices(int* ndev);
tsn_result_t jsGetProperties(int dev, tsn_props_t* props);
tsn_result_t jsListen(uint32_t ctxId, int dev, void* handle, uint32_t* listenId);
// connect/accept answer *commId = 0 while the connection is not up yet.
tsn_result_t jsConnect(uint32_t ctxId, int dev, int trafficClass, const void* handle, uint32_t* commId);
tsn_result_t jsAccept(uint32_t listenId, uint32_t* commId);
tsn_result_t jsRegMr(Comm* comm, void* data, size_t size, int type, Mr* mr);
tsn_result_t jsDeregMr(Comm* comm, Mr* mr);
tsn_result_t jsCloseComm(Comm* comm);
tsn_result_t jsCloseListen(uint32_t listenId);
tsn_result_t jsFinalize(uint32_t ctxId);
tsn_result_t jsSetNetAttr(uint32_t ctxId, const tsn_net_attr_t* attr);

// Something happened on the plugin thread: keeps the busy-poll window open (TSNET_SPIN_US).
void markActivity();
// True while the plugin thread polls (its busy-poll window is open): other threads need not
// wake it, it finds their work itself. Any thread.
bool pluginPolling();

// Comms the plugin may complete requests of (plugin thread only).
void commRegister(Comm* comm);
void commForget(Comm* comm);

}  // namespace tsn
