// The Node host. The whole lifecycle of an embedded Node environment reads as one function,
// protocolMain: initialize Node once (thread 0), create the environment, register the binding,
// load the plugin, spin the loop. Every protocol thread runs its own environment (its own
// isolate and event loop) on the one V8 platform. The runtime is never torn down: NCCL may
// dlclose and dlopen the library again (it is linked -z nodelete) and V8 cannot be initialised
// twice in one process.
#include "host.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <node.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "../native/binding.h"
#include "../native/engine/engine.h"
#include "../native/guest.h"

namespace tsn {
namespace {

enum class State { kIdle, kStarting, kRunning, kFailed, kStopped };

struct ControlCall {
  const std::function<tsn_result_t()>* fn;
  tsn_result_t rc;
  bool done;
  const char* call;  // its name, a string literal
  uint64_t ranNs;    // time the protocol thread spent running it
};

uint64_t nowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// One protocol thread as the rest of the process sees it.
struct Thread {
  State state = State::kIdle;
  std::string why;  // why it is not running
  std::deque<ControlCall*> control;
  std::atomic<Request*> posted{nullptr};
  std::atomic<int> waiting{0};  // control calls queued
  void (*wake)(int) = nullptr;
  std::atomic<bool> down{false};  // it ran and stopped: requests posted to it never complete
  std::vector<ControlCallStats> stats;  // by call name, under Host::mu
};

// Never destroyed: the protocol threads may still run while the process exits.
struct Host {
  std::mutex mu;
  std::condition_variable cv;
  Thread threads[kMaxProtocolThreads];
  std::atomic<int> started{0};  // threads that may take calls (0..started-1)
  std::string entry;
  std::atomic<pid_t> pid{0};  // the process the protocol threads run in
  // Made once by thread 0, shared by every thread's environment.
  std::unique_ptr<node::InitializationResult> init;
  std::unique_ptr<node::MultiIsolatePlatform> platform;
};
Host& host() {
  static Host* h = new Host();
  return *h;
}

bool isFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The JS entry: TSNET_JS_ENTRY, else found relative to this shared object
// (a bundle keeps it in js/ beside the library, a build tree in ../dist/).
std::string findEntry(std::string* tried) {
  if (const char* e = getenv("TSNET_JS_ENTRY"); e && *e) {
    *tried = e;
    return isFile(e) ? std::string(e) : std::string();
  }
  Dl_info info;
  std::string dir = ".";
  if (dladdr(reinterpret_cast<void*>(&hostStart), &info) && info.dli_fname) {
    std::string so = info.dli_fname;
    char* real = realpath(so.c_str(), nullptr);
    if (real) { so = real; free(real); }
    dir = so.substr(0, so.find_last_of('/'));
  }
  for (const char* rel : {"/js/plugin/index.js", "/../dist/plugin/index.js"}) {
    std::string p = dir + rel;
    if (!tried->empty()) *tried += ", ";
    *tried += p;
    if (isFile(p)) return p;
  }
  return std::string();
}

// The first builtin libnode reads from an absolute path at start-up (Debian's libnode: under
// /usr/share/nodejs; CMakeLists.txt lists them from libnode's config.gypi) that is missing,
// or "" when none is. libnode aborts the process on a missing one, so init checks first.
#ifndef TSN_NODE_BUILTINS
#define TSN_NODE_BUILTINS ""
#endif
std::string missingBuiltin() {
  const std::string list = TSN_NODE_BUILTINS;
  for (size_t at = 0; at < list.size();) {
    size_t end = list.find(':', at);
    if (end == std::string::npos) end = list.size();
    std::string p = list.substr(at, end - at);
    if (!p.empty() && !isFile(p)) return p;
    at = end + 1;
  }
  return std::string();
}

void setState(int index, State s, const std::string& why = std::string()) {
  Host& h = host();
  std::lock_guard<std::mutex> g(h.mu);
  Thread& t = h.threads[index];
  if ((s == State::kStopped || s == State::kFailed) && t.state == State::kRunning) t.down.store(true);
  if (!why.empty() && !(t.state == State::kStopped && s == State::kStopped)) t.why = why;  // the first reason stays
  t.state = s;
  if (s != State::kRunning) {
    for (ControlCall* c : t.control) { c->rc = TSN_INTERNAL_ERROR; c->done = true; }
    t.control.clear();
    t.waiting.store(0);
  }
  h.cv.notify_all();
}

std::string jsString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Node and V8, once per process (thread 0). Returns the errors, if any.
std::vector<std::string> initNode() {
  using namespace node;
  Host& h = host();
  // A guest in someone else's process: no NODE_OPTIONS, no command line, no stdio or
  // terminal changes, no signal handlers, no resource limit changes.
  std::vector<std::string> args{"tsnet"};
  h.init = InitializeOncePerProcess(
      args, {ProcessInitializationFlags::kNoInitializeV8,
             ProcessInitializationFlags::kNoInitializeNodeV8Platform,
             ProcessInitializationFlags::kDisableNodeOptionsEnv,
             ProcessInitializationFlags::kDisableCLIOptions,
             ProcessInitializationFlags::kNoStdioInitialization,
             ProcessInitializationFlags::kNoDefaultSignalHandling,
             ProcessInitializationFlags::kNoParseGlobalDebugVariables,
             ProcessInitializationFlags::kNoAdjustResourceLimits,
             ProcessInitializationFlags::kNoUseLargePages,
             ProcessInitializationFlags::kNoPrintHelpOrVersionOutput,
             ProcessInitializationFlags::kNoInitOpenSSL});
  std::vector<std::string> errors = h.init->errors();
  if (h.init->early_return()) errors.push_back("node initialisation stopped early");
  if (!errors.empty()) return errors;
  h.platform = MultiIsolatePlatform::Create(2);
  // gc() in tsnet's own isolate: a protocol thread collects once its last comm has closed, so
  // that the native memory its views held goes (plugin/plugin.ts, idleCollect).
  v8::V8::SetFlagsFromString("--expose-gc");
  // A development aid (e.g. --perf-basic-prof for perf); never read from NODE_OPTIONS.
  if (const char* flags = getenv("TSNET_V8_FLAGS"); flags && *flags) v8::V8::SetFlagsFromString(flags);
  v8::V8::InitializePlatform(h.platform.get());
  v8::V8::Initialize();
  return errors;
}

// One protocol thread's whole life: (thread 0: initialize Node once), create the environment,
// register the binding, load the plugin, spin the loop for as long as the process runs.
void protocolMain(int index) {
  using namespace node;
  Host& h = host();
  char name[16];
  snprintf(name, sizeof name, index ? "tsnet-proto%d" : "tsnet-plugin", index);
  pthread_setname_np(pthread_self(), name);
  // The host's signals go to the host's threads: this thread and the V8 platform threads it
  // starts (which inherit the mask) take none but faults (native/guest.h).
  tsn::blockHostSignals();
  std::vector<std::string> errors;
  if (index == 0) {
    // Node's platform threads (2 workers and the delayed-task scheduler) inherit this thread's
    // name: they are named tsnet-v8, so that `top -H` and a per-thread CPU count tell V8's
    // background work (compilers, the collector's helpers) from the plugin thread's.
    pthread_setname_np(pthread_self(), "tsnet-v8");
    errors = initNode();
    pthread_setname_np(pthread_self(), name);
  }
  std::unique_ptr<CommonEnvironmentSetup> setup;
  if (errors.empty()) {
    auto flags = static_cast<EnvironmentFlags::Flags>(
        EnvironmentFlags::kNoRegisterESMLoader | EnvironmentFlags::kNoCreateInspector |
        EnvironmentFlags::kNoGlobalSearchPaths);
    setup = CommonEnvironmentSetup::Create(h.platform.get(), &errors, h.init->args(), h.init->exec_args(), flags);
  }
  if (!setup) {
    std::string why = "could not start the embedded Node:";
    for (auto& e : errors) why += " " + e;
    setState(index, State::kFailed, why);
    return;
  }
  v8::Isolate* isolate = setup->isolate();
  Environment* env = setup->env();
  {
    v8::Locker locker(isolate);
    v8::Isolate::Scope isolate_scope(isolate);
    v8::HandleScope handle_scope(isolate);
    v8::Context::Scope context_scope(setup->context());
    bindingSetThread(index);
    // process.exit() inside the plugin stops that protocol thread, never the host process.
    SetProcessExitHandler(env, [](Environment* e, int code) {
      int i = bindingThreadIndex();
      log(kLogWarn, "the plugin called process.exit(%d) on protocol thread %d; it stops", code, i);
      setState(i, State::kStopped, "the plugin exited");
      engineClosePort(i);
      Stop(e);
    });
    AddLinkedBinding(env, "tsnet", bindingInit, 8);
    std::string src =
        "const binding = process._linkedBinding('tsnet');\n"
        "try {\n"
        "  globalThis.require = require('module').createRequire(" + jsString(h.entry) + ");\n"
        "  globalThis.require(" + jsString(h.entry) + ");\n"
        "} catch (e) { binding.loadFailed(String((e && e.stack) || e)); }\n";
    if (LoadEnvironment(env, src.c_str()).IsEmpty())
      setState(index, State::kFailed, "the plugin's JavaScript threw while loading");
    {
      std::lock_guard<std::mutex> g(h.mu);
      Thread& t = h.threads[index];
      if (t.state == State::kStarting) {
        t.state = State::kFailed;
        t.why = "the plugin's JavaScript did not call binding.start()";
        h.cv.notify_all();
      }
    }
    SpinEventLoop(env).FromMaybe(1);
  }
  setState(index, State::kStopped, "the plugin's event loop ended");
  engineClosePort(index);
  // The environment and the platform are deliberately leaked: see the note at the top.
  setup.release();
}

// A child forked after the plugin started inherits its memory, locks included (one may have
// been held by a thread that the child does not have), but none of its threads. The
// pthread_atfork handler marks the child; the pid catches a fork that runs no handlers (a raw
// clone). Checked before any lock is taken.
std::atomic<bool> g_forked{false};

void markForked() { g_forked.store(true, std::memory_order_relaxed); }

bool forkedChild(Host& h, const char* call) {
  pid_t started = h.pid.load(std::memory_order_relaxed);
  if (!g_forked.load(std::memory_order_relaxed) && (started == 0 || started == getpid())) return false;
  log(kLogWarn,
      "%s: this process (%d) was forked from process %d after the plugin started there; the plugin's threads "
      "did not come along, so it cannot be used in this process",
      call, int(getpid()), int(started));
  return true;
}

// Node's platform, made by protocol thread 0 (initNode): 2 worker threads and the delayed-task
// scheduler. Node aborts the process when it cannot create one, or waits forever for it.
constexpr int kNodePlatformThreads = 3;
// How long an init waits for a protocol thread to start (Node's start takes well under a
// second): past it the call fails instead of waiting on a thread stuck inside Node.
constexpr int kStartTimeoutSec = 60;

// Whether n more threads can run at once in this process: made, held until all exist, then
// ended. A process at its thread limit must get an error from init, not reach Node's abort.
bool threadsAvailable(int n, std::string* why) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::thread> made;
  try {
    for (int i = 0; i < n; i++)
      made.emplace_back([&] {
        tsn::blockHostSignals();  // the host's signals go to the host's threads
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return release; });
      });
  } catch (const std::system_error& e) {
    *why = e.what();
  }
  {
    std::lock_guard<std::mutex> g(mu);
    release = true;
  }
  cv.notify_all();
  for (std::thread& t : made) t.join();
  return static_cast<int>(made.size()) == n;
}

// Starts protocol thread i (detached). A process out of threads (a container's pids limit,
// RLIMIT_NPROC) makes std::thread throw: that must become an error for NCCL, never an
// exception through C or V8 frames (std::terminate, the host process gone).
bool startThread(int i, std::string* why) {
  try {
    std::thread(protocolMain, i).detach();
    return true;
  } catch (const std::system_error& e) {
    *why = e.what();
    return false;
  }
}

}  // namespace

void onProcessExit();  // below: what an exit does to tsnet's threads

tsn_result_t hostStart() {
  Host& h = host();
  if (forkedChild(h, "init")) return TSN_INTERNAL_ERROR;
  std::unique_lock<std::mutex> lk(h.mu);
  Thread& t0 = h.threads[0];
  if (t0.state == State::kIdle) {
    std::string tried;
    h.entry = findEntry(&tried);
    std::string builtin = missingBuiltin();
    if (!builtin.empty()) {
      t0.state = State::kFailed;
      t0.why = "libnode's builtin " + builtin +
               " is missing: Node cannot start without it (the bundle's install.sh puts it there, as root, "
               "once per machine; see docs/install.md)";
    } else if (h.entry.empty()) {
      t0.state = State::kFailed;
      t0.why = "the plugin's JavaScript entry was not found (tried " + tried + "; set TSNET_JS_ENTRY)";
    } else {
      t0.state = State::kStarting;
      h.pid.store(getpid());
      static std::once_flag atfork;
      std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, markForked); });
      log(kLogInfo, "starting the plugin thread with %s", h.entry.c_str());
      std::string why;
      bool room = threadsAvailable(1 + kNodePlatformThreads, &why);
      if (!room || !startThread(0, &why)) {
        t0.state = State::kIdle;  // a later init tries again
        lk.unlock();
        if (room) log(kLogWarn, "cannot start the plugin thread: %s", why.c_str());
        else log(kLogWarn, "cannot start the plugin: the process cannot run the %d threads the plugin thread and Node's platform need (%s)",
                 1 + kNodePlatformThreads, why.c_str());
        return TSN_SYSTEM_ERROR;
      }
    }
  }
  if (!h.cv.wait_for(lk, std::chrono::seconds(kStartTimeoutSec), [&] { return t0.state != State::kStarting; })) {
    lk.unlock();
    log(kLogWarn, "the plugin thread has not started after %d s: it is stuck inside Node's start", kStartTimeoutSec);
    return TSN_SYSTEM_ERROR;
  }
  if (t0.state == State::kRunning) {
    // Registered now, after the plugin's load initialised OpenSSL (plugin/index.ts): exit
    // handlers run newest first, so this one runs before OpenSSL's cleanup.
    static std::once_flag atexitOnce;
    std::call_once(atexitOnce, [] { atexit(onProcessExit); });
    return TSN_SUCCESS;
  }
  log(kLogWarn, "%s", t0.why.c_str());
  return TSN_INTERNAL_ERROR;
}

tsn_result_t hostStartMore(int n, std::string* why) {
  Host& h = host();
  std::unique_lock<std::mutex> lk(h.mu);
  if (n < 1 || n > kMaxProtocolThreads) {
    *why = "protocol threads must be 1 to " + std::to_string(kMaxProtocolThreads);
    return TSN_INVALID_ARGUMENT;
  }
  if (h.started.load() > 1) return TSN_SUCCESS;
  // A thread is started once: one that runs from an earlier, failed attempt stays (idle until
  // all start), and one that failed is not tried again (its error is reported each time). One
  // that could not be created (out of threads) is tried again at the next attempt.
  for (int i = 1; i < n; i++) {
    if (h.threads[i].state != State::kIdle) continue;
    h.threads[i].state = State::kStarting;
    std::string err;
    if (!startThread(i, &err)) {
      h.threads[i].state = State::kIdle;
      h.threads[i].why = "cannot start it: " + err;
    }
  }
  bool settled = h.cv.wait_for(lk, std::chrono::seconds(kStartTimeoutSec), [&] {
    for (int i = 1; i < n; i++)
      if (h.threads[i].state == State::kStarting) return false;
    return true;
  });
  if (!settled) {
    *why = "a protocol thread has not started after " + std::to_string(kStartTimeoutSec) + " s";
    return TSN_SYSTEM_ERROR;
  }
  for (int i = 1; i < n; i++)
    if (h.threads[i].state != State::kRunning) {
      *why = "protocol thread " + std::to_string(i) + ": " + h.threads[i].why;
      if (h.threads[i].state == State::kIdle) h.threads[i].why.clear();
      return TSN_INTERNAL_ERROR;  // the started ones stay idle: calls go to 0..started-1 only
    }
  h.started.store(n);
  return TSN_SUCCESS;
}

// The process is exiting (exit() from any thread, or main returning): the handler below runs
// before the exit handlers registered earlier, OpenSSL's and libnode's static destructors among
// them. Until it returns, protocol threads running JavaScript (a connect's randomBytes, a
// process.env read) would meet those libraries' state being torn down under them (a fault, or
// malloc's corruption check: 3 of 20 exits under a connect loop in one count). So it asks every
// protocol thread and every I/O thread to stop where it stands between two turns, and waits
// for them, at most kParkMs: one inside a provider call that does not return is left running.
std::atomic<bool> g_exiting{false};
std::atomic<int> g_parked{0};
constexpr int kParkMs = 300;

// A call once the process exits (from an exit handler that runs after tsnet's, a library's
// static destructor): its threads are parked, so it fails at once instead of waiting for good.
bool refusedAtExit(const char* call) {
  if (!g_exiting.load(std::memory_order_relaxed)) return false;
  log(kLogInfo, "%s: the process is exiting and tsnet's threads have stopped; refused", call);
  return true;
}

void onProcessExit() {
  Host& h = host();
  if (g_forked.load(std::memory_order_relaxed) || h.pid.load() != getpid()) return;  // a child: no threads of ours
  g_exiting.store(true, std::memory_order_seq_cst);
  int want = 0;
  for (int i = 0; i < kMaxProtocolThreads; i++) {
    Thread& t = h.threads[i];
    if (t.state != State::kRunning || !t.wake) continue;  // read without the lock: a thread holding it may be gone
    want++;
    t.wake(i);
  }
  int io = engineParkIo();
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kParkMs);
  while ((g_parked.load() < want || !engineIoParked(io)) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

bool hostExiting() { return g_exiting.load(std::memory_order_relaxed); }

void hostPark() {
  g_parked.fetch_add(1);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until the process is gone
}

bool hostDown(int thread, const char* call) {
  Host& h = host();
  if (g_forked.load(std::memory_order_relaxed) && forkedChild(h, call)) return true;
  if (refusedAtExit(call)) return true;
  if (thread < 0 || !h.threads[thread].down.load(std::memory_order_relaxed)) return false;
  log(kLogWarn, "%s: protocol thread %d has stopped (an earlier WARN says why); its requests cannot complete", call, thread);
  return true;
}

int hostThreads() { return std::max(1, host().started.load()); }

tsn_result_t hostCall(int thread, const std::function<tsn_result_t()>& fn, const char* call) {
  Host& h = host();
  if (forkedChild(h, call)) return TSN_INTERNAL_ERROR;
  if (refusedAtExit(call)) return TSN_INTERNAL_ERROR;  // an exit handler's call: no thread would run it
  ControlCall ctl{&fn, TSN_SUCCESS, false, call, 0};
  std::unique_lock<std::mutex> lk(h.mu);
  Thread& t = h.threads[thread];
  if (t.state != State::kRunning) {
    log(kLogWarn, "the plugin is not running: %s", t.why.empty() ? "init was not called" : t.why.c_str());
    return TSN_INTERNAL_ERROR;
  }
  const uint64_t t0 = nowNs();
  t.control.push_back(&ctl);
  t.waiting.fetch_add(1, std::memory_order_seq_cst);
  t.wake(thread);
  h.cv.wait(lk, [&] { return ctl.done; });
  // What the caller waited (hand-over, queue, the call, the way back), by call name.
  const uint64_t waitedNs = nowNs() - t0;
  ControlCallStats* st = nullptr;
  for (ControlCallStats& x : t.stats)
    if (x.call == call || std::strcmp(x.call, call) == 0) {
      st = &x;
      break;
    }
  if (!st) {
    t.stats.push_back(ControlCallStats{call, 0, 0, 0, 0});
    st = &t.stats.back();
  }
  st->count++;
  st->waitedNs += waitedNs;
  st->ranNs += ctl.ranNs;
  if (waitedNs > st->maxWaitedNs) st->maxWaitedNs = waitedNs;
  return ctl.rc;
}

std::vector<ControlCallStats> hostCallStats(int thread) {
  Host& h = host();
  std::lock_guard<std::mutex> g(h.mu);
  return h.threads[thread].stats;
}

void hostPost(int thread, Request* r) {
  Thread& t = host().threads[thread];
  Request* head = t.posted.load(std::memory_order_relaxed);
  do { r->next = head; } while (!t.posted.compare_exchange_weak(head, r, std::memory_order_seq_cst,
                                                               std::memory_order_relaxed));
  if (t.wake) t.wake(thread);
}

Request* hostTakePosted(int thread) {
  Request* r = host().threads[thread].posted.exchange(nullptr, std::memory_order_acquire);
  Request* fifo = nullptr;
  while (r) { Request* next = r->next; r->next = fifo; fifo = r; r = next; }
  return fifo;
}

bool hostRunOneControl(int thread, void (*beforeRun)(), const char** call) {
  Host& h = host();
  Thread& t = h.threads[thread];
  ControlCall* c;
  {
    std::lock_guard<std::mutex> g(h.mu);
    if (t.control.empty()) return false;
    c = t.control.front();
    t.control.pop_front();
    t.waiting.fetch_sub(1, std::memory_order_relaxed);
  }
  if (call) *call = c->call;
  beforeRun();
  const uint64_t t0 = nowNs();
  tsn_result_t rc = (*c->fn)();
  const uint64_t ran = nowNs() - t0;
  std::lock_guard<std::mutex> g(h.mu);
  c->ranNs = ran;
  c->rc = rc;
  c->done = true;
  h.cv.notify_all();
  return true;
}

bool hostHasWork(int thread) {
  Thread& t = host().threads[thread];
  return t.posted.load(std::memory_order_seq_cst) || t.waiting.load(std::memory_order_seq_cst) > 0;
}

void hostReady(int thread, void (*wake)(int)) {
  Host& h = host();
  std::lock_guard<std::mutex> g(h.mu);
  h.threads[thread].wake = wake;
  h.threads[thread].state = State::kRunning;
  if (thread == 0 && h.started.load() == 0) h.started.store(1);
  h.cv.notify_all();
}

void hostLoadFailed(int thread, const std::string& why) {
  setState(thread, State::kFailed, "the plugin failed to load: " + why);
}

}  // namespace tsn
