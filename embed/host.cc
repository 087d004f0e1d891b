// The Node host. The whole lifecycle of the embedded Node reads as one function, pluginMain:
// initialize once, create the environment, register the binding, load the plugin, spin the
// loop. The runtime is never torn down: NCCL may dlclose and dlopen the library again
// (it is linked -z nodelete) and V8 cannot be initialised twice in one process.
#include "host.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <node.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "../native/binding.h"

namespace tsn {
namespace {

enum class State { kIdle, kStarting, kRunning, kFailed, kStopped };

struct ControlCall {
  const std::function<tsn_result_t()>* fn;
  tsn_result_t rc;
  bool done;
};

// Never destroyed: the plugin thread may still run while the process exits.
struct Host {
  std::mutex mu;
  std::condition_variable cv;
  State state = State::kIdle;
  std::string why;  // why the plugin is not running
  std::deque<ControlCall*> control;
  std::atomic<Request*> posted{nullptr};
  void (*wake)() = nullptr;
  std::atomic<int> waiting{0};  // control calls queued
  pid_t pid = 0;  // the process the plugin thread runs in
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

void setState(State s, const std::string& why = std::string()) {
  Host& h = host();
  std::lock_guard<std::mutex> g(h.mu);
  h.state = s;
  if (!why.empty()) h.why = why;
  if (s != State::kRunning) {
    for (ControlCall* c : h.control) { c->rc = TSN_INTERNAL_ERROR; c->done = true; }
    h.control.clear();
    h.waiting.store(0);
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

void plugin_main(std::string entry) {
  using namespace node;
  pthread_setname_np(pthread_self(), "tsnet-plugin");
  // The host's signals go to the host's threads: this thread and the V8 platform threads it
  // starts (which inherit the mask) take none.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  // A guest in someone else's process: no NODE_OPTIONS, no command line, no stdio or
  // terminal changes, no signal handlers, no resource limit changes.
  std::vector<std::string> args{"tsnet"};
  std::unique_ptr<InitializationResult> init = InitializeOncePerProcess(
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
  std::vector<std::string> errors = init->errors();
  if (init->early_return()) errors.push_back("node initialisation stopped early");
  std::unique_ptr<MultiIsolatePlatform> platform;
  std::unique_ptr<CommonEnvironmentSetup> setup;
  if (errors.empty()) {
    platform = MultiIsolatePlatform::Create(2);
    // A development aid (e.g. --perf-basic-prof for perf); never read from NODE_OPTIONS.
    if (const char* flags = getenv("TSNET_V8_FLAGS"); flags && *flags) v8::V8::SetFlagsFromString(flags);
    v8::V8::InitializePlatform(platform.get());
    v8::V8::Initialize();
    auto flags = static_cast<EnvironmentFlags::Flags>(
        EnvironmentFlags::kNoRegisterESMLoader | EnvironmentFlags::kNoCreateInspector |
        EnvironmentFlags::kNoGlobalSearchPaths);
    setup = CommonEnvironmentSetup::Create(platform.get(), &errors, init->args(),
                                           init->exec_args(), flags);
  }
  if (!setup) {
    std::string why = "could not start the embedded Node:";
    for (auto& e : errors) why += " " + e;
    setState(State::kFailed, why);
    return;
  }
  v8::Isolate* isolate = setup->isolate();
  Environment* env = setup->env();
  {
    v8::Locker locker(isolate);
    v8::Isolate::Scope isolate_scope(isolate);
    v8::HandleScope handle_scope(isolate);
    v8::Context::Scope context_scope(setup->context());
    // process.exit() inside the plugin stops the plugin, never the host process.
    SetProcessExitHandler(env, [](Environment* e, int code) {
      log(kLogWarn, "the plugin called process.exit(%d); tsnet stops", code);
      setState(State::kStopped, "the plugin exited");
      Stop(e);
    });
    AddLinkedBinding(env, "tsnet", bindingInit, 8);
    std::string src =
        "const binding = process._linkedBinding('tsnet');\n"
        "try {\n"
        "  globalThis.require = require('module').createRequire(" + jsString(entry) + ");\n"
        "  globalThis.require(" + jsString(entry) + ");\n"
        "} catch (e) { binding.loadFailed(String((e && e.stack) || e)); }\n";
    if (LoadEnvironment(env, src.c_str()).IsEmpty())
      setState(State::kFailed, "the plugin's JavaScript threw while loading");
    {
      std::lock_guard<std::mutex> g(host().mu);
      if (host().state == State::kStarting) {
        host().state = State::kFailed;
        host().why = "the plugin's JavaScript did not call binding.start()";
        host().cv.notify_all();
      }
    }
    SpinEventLoop(env).FromMaybe(1);
  }
  setState(State::kStopped, "the plugin's event loop ended");
  // The environment and the platform are deliberately leaked: see the note at the top.
  setup.release();
  platform.release();
}

// A child forked after the plugin started inherits its state but not its thread.
bool forkedChild(Host& h) {
  if (h.pid == 0 || h.pid == getpid()) return false;
  log(kLogWarn, "the plugin was started in process %d; this forked child (%d) cannot use it", int(h.pid), int(getpid()));
  return true;
}

}  // namespace

tsn_result_t hostStart() {
  Host& h = host();
  std::unique_lock<std::mutex> lk(h.mu);
  if (forkedChild(h)) return TSN_INTERNAL_ERROR;
  if (h.state == State::kIdle) {
    std::string tried;
    std::string entry = findEntry(&tried);
    if (entry.empty()) {
      h.state = State::kFailed;
      h.why = "the plugin's JavaScript entry was not found (tried " + tried +
              "; set TSNET_JS_ENTRY)";
    } else {
      h.state = State::kStarting;
      h.pid = getpid();
      log(kLogInfo, "starting the plugin thread with %s", entry.c_str());
      std::thread(plugin_main, entry).detach();
    }
  }
  h.cv.wait(lk, [&] { return h.state != State::kStarting; });
  if (h.state == State::kRunning) return TSN_SUCCESS;
  log(kLogWarn, "%s", h.why.c_str());
  return TSN_INTERNAL_ERROR;
}

tsn_result_t hostCall(const std::function<tsn_result_t()>& fn) {
  Host& h = host();
  ControlCall call{&fn, TSN_SUCCESS, false};
  std::unique_lock<std::mutex> lk(h.mu);
  if (forkedChild(h)) return TSN_INTERNAL_ERROR;
  if (h.state != State::kRunning) {
    log(kLogWarn, "the plugin is not running: %s", h.why.empty() ? "init was not called" : h.why.c_str());
    return TSN_INTERNAL_ERROR;
  }
  h.control.push_back(&call);
  h.waiting.fetch_add(1, std::memory_order_seq_cst);
  h.wake();
  h.cv.wait(lk, [&] { return call.done; });
  return call.rc;
}

void hostPost(Request* r) {
  Host& h = host();
  Request* head = h.posted.load(std::memory_order_relaxed);
  do { r->next = head; } while (!h.posted.compare_exchange_weak(head, r, std::memory_order_seq_cst,
                                                               std::memory_order_relaxed));
  if (h.wake) h.wake();
}

Request* hostTakePosted() {
  Request* r = host().posted.exchange(nullptr, std::memory_order_acquire);
  Request* fifo = nullptr;
  while (r) { Request* next = r->next; r->next = fifo; fifo = r; r = next; }
  return fifo;
}

bool hostRunOneControl(void (*beforeRun)()) {
  Host& h = host();
  ControlCall* c;
  {
    std::lock_guard<std::mutex> g(h.mu);
    if (h.control.empty()) return false;
    c = h.control.front();
    h.control.pop_front();
    h.waiting.fetch_sub(1, std::memory_order_relaxed);
  }
  beforeRun();
  tsn_result_t rc = (*c->fn)();
  std::lock_guard<std::mutex> g(h.mu);
  c->rc = rc;
  c->done = true;
  h.cv.notify_all();
  return true;
}

bool hostHasWork() {
  Host& h = host();
  return h.posted.load(std::memory_order_seq_cst) || h.waiting.load(std::memory_order_seq_cst) > 0;
}

void hostReady(void (*wake)()) {
  Host& h = host();
  std::lock_guard<std::mutex> g(h.mu);
  h.wake = wake;
  h.state = State::kRunning;
  h.cv.notify_all();
}

void hostLoadFailed(const std::string& why) { setState(State::kFailed, "the plugin failed to load: " + why); }

}  // namespace tsn
