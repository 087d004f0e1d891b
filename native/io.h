// The native socket I/O engine: I/O threads that move bytes between sockets and memory views,
// driven from the plugin thread like a NIC's queues (post a write or a read, get a completion).
// docs/io-threads.md describes the design. The functions JS sees (ioStart, ioAdopt, ioWrite,
// ioRead, ioClose) run on the plugin thread; completions come back through a uv_async_t.
#pragma once
#include <node_api.h>

namespace tsn {

// Completion statuses (besides 0 = done and -errno): the peer closed the stream before a read
// was full. ECANCELED (-125 on Linux) is what ioClose gives the pending operations of a lane.
constexpr int kIoStatusEof = -1000;

// Plugin thread, while it polls: delivers completions that wait (no wake-up was sent).
void ioPoll();

// Adds ioStart, ioAdopt, ioWrite, ioRead, ioClose and ioConstants to the binding's exports.
void ioRegister(napi_env env, napi_value exports);

}  // namespace tsn
