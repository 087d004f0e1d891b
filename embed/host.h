// The Node host: one plugin thread owns a Node environment and its event loop.
// NCCL's threads hand it control calls (synchronous) and posted requests (queued).
#pragma once
#include <functional>
#include <string>

#include "../native/internal.h"

namespace tsn {

// Starts the plugin thread and loads the plugin's JavaScript, once per process.
// Waits until the plugin said it is ready (or failed to load).
tsn_result_t hostStart();

// Runs fn on the plugin thread and returns its result. Fails (internal error) when the
// plugin is not running.
tsn_result_t hostCall(const std::function<tsn_result_t()>& fn);

// Queues a posted request for the plugin thread and wakes it. Lock-free.
void hostPost(Request* r);

// --- used on the plugin thread by the binding ---

// Every posted request, oldest first, linked through Request::next.
Request* hostTakePosted();
// Runs the oldest waiting control call; false when none waits. beforeRun runs first, after
// the call was taken: requests posted before the call are then handled before it.
bool hostRunOneControl(void (*beforeRun)());
// The plugin is ready: calls may flow. wake() wakes the plugin thread (any thread may call it).
void hostReady(void (*wake)());
// True when posted requests or control calls wait (the polling plugin thread checks this).
bool hostHasWork();
// The plugin could not start; every caller gets an error naming why.
void hostLoadFailed(const std::string& why);

}  // namespace tsn
