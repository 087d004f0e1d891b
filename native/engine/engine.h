// The native I/O engine (docs/io-threads.md): I/O threads that own every socket of every
// link and move bytes between sockets and memory, driven by the protocol threads through
// shared-memory rings (records.h): submissions in, completions and arrived bytes out.
#pragma once
#include <node_api.h>

namespace tsn {

constexpr int kMaxPorts = 16;  // protocol threads, each with its own rings to every I/O thread

// True when I/O threads left completions for this protocol thread (any thread may ask).
bool enginePortHasWork(int port);

// Protocol thread `port` has stopped for good (the plugin called process.exit(), its loop
// ended): every lane it still has is closed hard, as ioClose would, so that no byte lands in
// memory NCCL takes back once its own closes (which fail) return. Runs on that thread.
void engineClosePort(int port);

// Early wake-ups (TSNET_EARLY_WAKE): the calling protocol thread is about to sleep; the fds of
// its lanes (a TCP control lane's socket, an endpoint's doorbell or wait fd) are armed again, one
// shot each, in its watch set, so that a message wakes it at the same time as the I/O thread
// that reads it instead of after it. Runs on that thread.
void engineArmWatches(int port);

// The process is exiting: every I/O thread stops at the top of its next pass, for good.
// engineParkIo asks them (returns how many there are); engineIoParked(n) says whether n have.
int engineParkIo();
bool engineIoParked(int n);

// Adds the io* functions (ioStart, ioPort, ioAdopt, ioWake, ioClose, ioCancel, ioStats, ioWakes) to
// the binding's exports of the calling protocol thread.
void engineRegister(napi_env env, napi_value exports);

// Makes the ArrayBuffer of a TCP control lane's receive ring over [p, p+bytes): memory the engine
// frees itself (at ioClose, or when V8 collects the ArrayBuffer), so the plugin's library makes
// one V8 does not count (binding.cc); without one, N-API's external ArrayBuffer.
using RingViewMaker = napi_value (*)(napi_env env, void* p, size_t bytes);
void engineSetRingView(RingViewMaker make);

}  // namespace tsn
