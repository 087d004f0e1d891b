// The Node host: protocol threads, each owning a Node environment and its event loop. Thread 0
// (the plugin thread) starts at the first init and starts the others when the plugin asks.
// NCCL's threads hand a protocol thread control calls (synchronous) and posted requests (queued).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../native/internal.h"

namespace tsn {

constexpr int kMaxProtocolThreads = 16;

// Starts protocol thread 0 and loads the plugin's JavaScript, once per process. Waits until
// the plugin said it is ready (or failed to load).
tsn_result_t hostStart();

// Runs fn on protocol thread `thread` and returns its result. Fails (internal error) when that
// thread is not running, or in a child forked after the plugin started (a WARN names `call`).
tsn_result_t hostCall(int thread, const std::function<tsn_result_t()>& fn, const char* call);

// The control calls of protocol thread `thread` so far, by name: how many, how long their
// callers (NCCL's threads) waited for them in all and at most, and how long the thread ran
// them (TSNET_STATS). The rest of a wait is the hand-over, the queue behind other calls and
// turns, and the way back.
struct ControlCallStats {
  const char* call;
  uint64_t count;
  uint64_t waitedNs;
  uint64_t ranNs;
  uint64_t maxWaitedNs;
};
std::vector<ControlCallStats> hostCallStats(int thread);

// True, after a WARN naming `call`, where a request for protocol thread `thread` could never
// complete: in a child forked after the plugin started (it has the plugin's memory but not its
// threads), or once that thread has stopped (the plugin called process.exit(), its loop
// ended; thread -1: the fork only). Two relaxed loads otherwise (the data path checks it).
bool hostDown(int thread, const char* call);

// Queues a posted request for protocol thread `thread` and wakes it. Lock-free.
void hostPost(int thread, Request* r);

// The process is exiting: a protocol thread calls hostPark() at its next chance, between turns.
bool hostExiting();
// Parks the calling thread for good (the process is exiting), after counting it as parked.
[[noreturn]] void hostPark();

// Protocol threads running (1 until the plugin starts more).
int hostThreads();

// --- used on protocol thread `thread` by the binding ---

// Starts protocol threads 1..n-1 (thread 0 only, once) and waits until each is ready.
tsn_result_t hostStartMore(int n, std::string* why);
// Every posted request, oldest first, linked through Request::next.
Request* hostTakePosted(int thread);
// Runs the oldest waiting control call; false when none waits. beforeRun runs first, after
// the call was taken: requests posted before the call are then handled before it. call (if
// not null) gets the call's name ("connect", "deregMr", ...: a string literal).
bool hostRunOneControl(int thread, void (*beforeRun)(), const char** call = nullptr);
// The thread's plugin is ready: calls may flow. wake(thread) wakes it (any thread may call it).
void hostReady(int thread, void (*wake)(int));
// True when posted requests or control calls wait for the thread (its polling loop checks this).
bool hostHasWork(int thread);
// The thread's plugin could not start; every caller gets an error naming why.
void hostLoadFailed(int thread, const std::string& why);

}  // namespace tsn
