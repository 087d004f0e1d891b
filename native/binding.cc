// The `tsnet` binding (node-addon-api), one instance per protocol thread. A protocol thread
// enters JavaScript only here: a turn hands the plugin the requests NCCL posted (a shared
// mailbox) and lets it read its completion rings; control calls run one at a time.
#include "binding.h"

#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#include <fcntl.h>
#include <sys/epoll.h>
#include <napi.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <v8.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "../embed/host.h"
#include "engine/engine.h"
#include "wake_delays_js.h"
#include "waker.h"

namespace tsn {
namespace {

constexpr int kRecordStride = TSN_POST_HEAD + TSN_POST_BUF * TSN_MAX_RECVS;
constexpr int kMailboxRecords = 1024;

struct Plugin {
  int index = 0;
  napi_env env = nullptr;
  Napi::FunctionReference control;  // control(op, args) -> { result, ... }
  Napi::FunctionReference turn;     // turn(count): count posted requests wait in the mailbox
  Napi::Reference<Napi::Float64Array> mailboxRef;
  double* mailbox = nullptr;
  napi_async_context async = nullptr;
  Waker waker;
  std::unordered_map<uint32_t, napi_ref> statusViews;  // comm id -> its slot-status ArrayBuffer
  // Busy-poll window: after activity the loop polls without sleeping for spinNs, so a reply
  // or the next post is seen without an epoll wake-up; then it sleeps again.
  uv_idle_t spin;
  uv_prepare_t beforePoll;  // park points when the process exits (hostPark)
  uv_check_t afterPoll;
  std::atomic<bool> spinning{false};
  uint64_t spinNs = 0;
  uint64_t lastActivity = 0;
  uint64_t busyNs = 0;  // time spent in turns and control calls (TSNET_STATS)
  // Early wake-ups (engineArmWatches): the engine's epoll set of this thread's lanes, watched by
  // the loop; how many times it woke the thread (TSNET_STATS).
  uv_poll_t* watch = nullptr;
  int watchFd = -1;
  uint64_t earlyWakes = 0;
  uint64_t lastTurnNs = 0;  // uv_hrtime() of the last turn (wakeState)
  // The longest turn or control call since the watchdog last asked (longest()), and its name.
  uint64_t longestNs = 0;
  const char* longestWhat = nullptr;
};
thread_local Plugin* P = nullptr;
thread_local int tIndex = -1;
Plugin* g_plugins[kMaxProtocolThreads] = {};
std::atomic<bool> g_trace{false};
int g_traceFd = -1;

double nowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// Interned C strings for properties: NCCL keeps the pointers, so they live forever.
const char* intern(const std::string& s) {
  static std::mutex* mu = new std::mutex();
  static std::set<std::string>* strings = new std::set<std::string>();
  std::lock_guard<std::mutex> g(*mu);
  return strings->insert(s).first->c_str();
}

// Calls into the plugin; exceptions and malformed answers become an internal error.
tsn_result_t callJs(Napi::FunctionReference& fn, const char* what, std::initializer_list<napi_value> args,
                    Napi::Object* answer) {
  Napi::Env env(P->env);
  napi_value res = nullptr;
  std::vector<napi_value> argv(args);
  if (!callPlugin(env, P->async, fn.Value(), what, argv.size(), argv.data(), &res)) return TSN_INTERNAL_ERROR;
  if (!answer) return TSN_SUCCESS;
  Napi::Value v(env, res);
  if (!v.IsObject()) {
    log(kLogWarn, "plugin answered %s with a non-object", what);
    return TSN_INTERNAL_ERROR;
  }
  *answer = v.As<Napi::Object>();
  Napi::Value rc = answer->Get("result");
  return rc.IsNumber() ? rc.As<Napi::Number>().Int32Value() : TSN_SUCCESS;
}

tsn_result_t control(const char* op, Napi::Object args, Napi::Object* answer) {
  Napi::Env env(P->env);
  return callJs(P->control, op, {Napi::String::New(env, op), args}, answer);
}

uint32_t u32(Napi::Object o, const char* key) {
  Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().Uint32Value() : 0;
}

// One turn of the plugin: the posted requests go into the mailbox (the plugin is called once
// per full or final mailbox) and the plugin reads its completion rings. Called when woken,
// while polling, and before each control call.
void runTurn() {
  P->lastTurnNs = uv_hrtime();
  Request* r = hostTakePosted(P->index);
  Napi::Env env(P->env);
  bool trace = g_trace.load(std::memory_order_relaxed);
  double taken = trace ? nowUs() : 0;
  bool called = false;
  while (r) {
    int count = 0;
    for (; r && count < kMailboxRecords; r = r->next, count++) {
      double* rec = P->mailbox + count * kRecordStride;
      rec[0] = r->op;
      rec[1] = r->comm->jsId;
      rec[2] = r->index;
      rec[3] = r->n;
      rec[4] = r->postedUs;
      rec[5] = taken;
      rec[6] = r->warmup ? 1 : 0;
      for (int i = 0; i < r->n; i++) {
        double* b = rec + TSN_POST_HEAD + TSN_POST_BUF * i;
        b[0] = r->bufs[i].mrId;
        b[1] = static_cast<double>(r->bufs[i].offset);
        b[2] = static_cast<double>(r->bufs[i].size);
        b[3] = r->bufs[i].tag;
      }
    }
    callJs(P->turn, "turn", {Napi::Number::New(env, count)}, nullptr);
    called = true;
  }
  if (!called && enginePortHasWork(P->index)) callJs(P->turn, "turn", {Napi::Number::New(env, 0)}, nullptr);
}

void pump();

// The busy-poll window: while it is open nobody wakes this thread, so it looks for work itself.
// Each visit polls in a tight loop for a while (every turn of libuv's loop costs an epoll_wait),
// then lets the loop run its timers and sockets.
void onSpin(uv_idle_t*) {
  constexpr uint64_t kVisitNs = 20'000;
  uint64_t until = uv_hrtime() + kVisitNs;
  do {
    if (hostHasWork(P->index) || enginePortHasWork(P->index)) pump();
  } while (uv_hrtime() < until && P->spinNs);
  if (uv_hrtime() - P->lastActivity < P->spinNs) return;
  uv_idle_stop(&P->spin);
  P->spinning.store(false, std::memory_order_seq_cst);
  if (P->watch) engineArmWatches(P->index);  // the next message wakes this thread with its I/O thread
  // Work posted just before the flag dropped found it set and sent no wake-up.
  if (hostHasWork(P->index) || enginePortHasWork(P->index)) pump();
}

void noteLongest(uint64_t ns, const char* what) {
  if (ns <= P->longestNs) return;
  P->longestNs = ns;
  P->longestWhat = what;
}

void pump() {
  if (hostExiting()) hostPark();
  markActivity();
  uint64_t t0 = uv_hrtime();
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  runTurn();
  uint64_t t = uv_hrtime();
  noteLongest(t - t0, "turn");
  const char* call = nullptr;
  while (hostRunOneControl(P->index, runTurn, &call)) {  // each with the turn before it
    uint64_t now = uv_hrtime();
    noteLongest(now - t, call);
    t = now;
  }
  P->busyNs += uv_hrtime() - t0;
}

// --- functions the plugin calls ---

Napi::Value Start(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (P) {
    Napi::Error::New(env, "tsnet binding already started").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Object h = info[0].As<Napi::Object>();
  if (!h.IsObject() || !h.Get("control").IsFunction() || !h.Get("turn").IsFunction()) {
    Napi::TypeError::New(env, "start({control, turn}) needs two functions").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  P = new Plugin();
  P->index = tIndex < 0 ? 0 : tIndex;
  P->env = env;
  P->control = Napi::Persistent(h.Get("control").As<Napi::Function>());
  P->turn = Napi::Persistent(h.Get("turn").As<Napi::Function>());
  Napi::ArrayBuffer buf = Napi::ArrayBuffer::New(env, kMailboxRecords * kRecordStride * sizeof(double));
  Napi::Float64Array mailbox = Napi::Float64Array::New(env, kMailboxRecords * kRecordStride, buf, 0);
  P->mailboxRef = Napi::Persistent(mailbox);
  P->mailbox = static_cast<double*>(buf.Data());
  napi_async_init(env, nullptr, Napi::String::New(env, "tsnet"), &P->async);
  uv_loop_s* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  if (!P->waker.init(loop, pump)) {
    Napi::Error::New(env, "start: no eventfd for the wake-up").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  uv_idle_init(loop, &P->spin);
  // Between two of the loop's turns (after its timers, after its poll): a thread asked to stop
  // because the process exits stops there (hostPark), never inside JavaScript.
  uv_prepare_init(loop, &P->beforePoll);
  uv_prepare_start(&P->beforePoll, [](uv_prepare_t*) { if (hostExiting()) hostPark(); });
  uv_unref(reinterpret_cast<uv_handle_t*>(&P->beforePoll));
  uv_check_init(loop, &P->afterPoll);
  uv_check_start(&P->afterPoll, [](uv_check_t*) { if (hostExiting()) hostPark(); });
  uv_unref(reinterpret_cast<uv_handle_t*>(&P->afterPoll));
  g_plugins[P->index] = P;
  hostReady(P->index, pluginWake);
  Napi::Object out = Napi::Object::New(env);
  out.Set("mailbox", mailbox);
  out.Set("recordStride", kRecordStride);
  out.Set("recordHead", TSN_POST_HEAD);
  out.Set("slotsPerComm", kSlotsPerComm);
  out.Set("thread", P->index);
  return out;
}

Napi::Value LoadFailed(const Napi::CallbackInfo& info) {
  hostLoadFailed(tIndex < 0 ? 0 : tIndex, info[0].ToString().Utf8Value());
  return info.Env().Undefined();
}

// startThreads(n): protocol threads 1..n-1 (thread 0 only). Throws naming why on failure.
Napi::Value StartThreads(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int n = info[0].As<Napi::Number>().Int32Value();
  std::string why;
  if (P->index != 0) why = "only protocol thread 0 starts the others";
  else if (hostStartMore(n, &why) == TSN_SUCCESS) return env.Undefined();
  Napi::Error::New(env, "startThreads: " + why).ThrowAsJavaScriptException();
  return env.Undefined();
}

// setSpin(us): the busy-poll window after activity; 0 never spins.
Napi::Value SetSpin(const Napi::CallbackInfo& info) {
  double us = info[0].As<Napi::Number>().DoubleValue();
  P->spinNs = us > 0 ? static_cast<uint64_t>(us * 1000) : 0;
  return info.Env().Undefined();
}

Napi::Value Log(const Napi::CallbackInfo& info) {
  int level = info[0].As<Napi::Number>().Int32Value();
  unsigned long flags = static_cast<unsigned long>(info[1].As<Napi::Number>().Int64Value());
  logMessage(level, flags, info[2].ToString().Utf8Value().c_str());
  return info.Env().Undefined();
}

// now(): CLOCK_MONOTONIC in microseconds, the clock of every trace timestamp.
Napi::Value Now(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), nowUs()); }

// threadCpu(): CPU microseconds the calling thread has used.
Napi::Value ThreadCpu(const Napi::CallbackInfo& info) {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return Napi::Number::New(info.Env(), static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3);
}

// busy(): microseconds this thread spent in turns and control calls (not polling, not asleep).
// earlyWakes() -> how many times a lane's readiness woke this thread with its I/O thread.
Napi::Value EarlyWakes(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), static_cast<double>(P->earlyWakes)); }

Napi::Value Busy(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), static_cast<double>(P->busyNs) / 1e3); }

// longest() -> { us, what }: the longest turn or control call of this thread since the last
// longest() (what: "turn", or the call's name; null when there was none), then starts over.
Napi::Value Longest(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  o.Set("us", static_cast<double>(P->longestNs) / 1e3);
  o.Set("what", P->longestWhat ? Napi::Value(Napi::String::New(env, P->longestWhat)) : env.Null());
  P->longestNs = 0;
  P->longestWhat = nullptr;
  return o;
}

// runWait() -> microseconds the calling thread has waited for a CPU while runnable (the second
// figure of /proc/thread-self/schedstat), or -1 where the kernel does not tell.
Napi::Value RunWait(const Napi::CallbackInfo& info) {
  double us = -1;
  int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    unsigned long long run = 0, wait = 0;
    if (n > 0) {
      buf[n] = 0;
      if (sscanf(buf, "%llu %llu", &run, &wait) == 2) us = static_cast<double>(wait) / 1e3;
    }
  }
  return Napi::Number::New(info.Env(), us);
}

// wakes() -> how late this protocol thread took the wake-ups other threads sent it.
Napi::Value Wakes(const Napi::CallbackInfo& info) { return wakeDelaysObject(info.Env(), P->waker.delays); }

// controlCalls() -> [{ call, count, waitedUs, ranUs, maxWaitedUs }]: this thread's control
// calls by name, as their callers waited for them (embed/host.h, TSNET_STATS).
Napi::Value ControlCalls(const Napi::CallbackInfo& info) {
  Napi::Env e = info.Env();
  std::vector<ControlCallStats> all = hostCallStats(P->index);
  Napi::Array out = Napi::Array::New(e, all.size());
  for (size_t i = 0; i < all.size(); i++) {
    Napi::Object o = Napi::Object::New(e);
    o.Set("call", all[i].call);
    o.Set("count", static_cast<double>(all[i].count));
    o.Set("waitedUs", static_cast<double>(all[i].waitedNs) / 1e3);
    o.Set("ranUs", static_cast<double>(all[i].ranNs) / 1e3);
    o.Set("maxWaitedUs", static_cast<double>(all[i].maxWaitedNs) / 1e3);
    out.Set(static_cast<uint32_t>(i), o);
  }
  return out;
}

// wakeSelf(): a wake-up of this thread, as another thread sends it: a full turn (posted
// requests and completions) once libuv reads the eventfd, right after the current callback.
Napi::Value WakeSelf(const Napi::CallbackInfo& info) {
  P->waker.wake();
  return info.Env().Undefined();
}

// wakeState() -> { work, pending, readable, spinning, sinceTurnMs }: whether requests or
// completions wait for this thread, whether a wake-up is on its way (asked, or in the eventfd
// that libuv watches), whether its busy-poll window is open, and how long ago its last turn
// was. Called from a timer of this thread, so never between a wake-up's callback and its turn:
// work that waits with no wake-up on its way and no turn for a while was never announced.
Napi::Value WakeState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
  bool spinning = false, pending = false, readable = false;
  pluginWakeState(P->index, &spinning, &pending, &readable);
  o.Set("work", hostHasWork(P->index) || enginePortHasWork(P->index));
  o.Set("pending", pending);
  o.Set("readable", readable);
  o.Set("spinning", spinning);
  o.Set("sinceTurnMs", P->lastTurnNs ? static_cast<double>(uv_hrtime() - P->lastTurnNs) / 1e6 : -1);
  return o;
}

// traceOpen(path): opens (truncates) the process's trace file once and turns on timestamps;
// false when it cannot be opened. traceWrite(text): appends, atomically per call.
Napi::Value TraceOpen(const Napi::CallbackInfo& info) {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  if (g_traceFd < 0) {
    std::string path = info[0].ToString().Utf8Value();
    g_traceFd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (g_traceFd < 0) return Napi::Boolean::New(info.Env(), false);
    ssize_t w = write(g_traceFd, "[\n", 2);
    (void)w;
    g_trace.store(true);
  }
  return Napi::Boolean::New(info.Env(), true);
}

// timestamps(): requests and completions carry their times from now on, with no trace file
// (TSNET_STATS=steps keeps them in memory).
Napi::Value Timestamps(const Napi::CallbackInfo& info) {
  g_trace.store(true);
  return info.Env().Undefined();
}

// Events of several threads, one write per call: ",\n" joins them, so the file is a JSON array
// whose closing bracket is missing (both viewers accept that).
Napi::Value TraceWrite(const Napi::CallbackInfo& info) {
  static std::mutex mu;
  static bool first = true;
  if (g_traceFd >= 0) {
    std::string s = info[0].ToString().Utf8Value();
    std::lock_guard<std::mutex> g(mu);
    if (!first) s = ",\n" + s;
    first = false;
    ssize_t w = write(g_traceFd, s.data(), s.size());
    (void)w;
  }
  return info.Env().Undefined();
}

// An ArrayBuffer over memory that is not V8's to free: NCCL's registered regions (detached at
// deregMr, before NCCL frees them) and the engine's receive rings (detached at ioClose, freed by
// the engine). Its backing store has V8's empty deleter, so V8 neither frees the memory nor
// counts it as external memory of its heap. Counted (as napi_create_external_arraybuffer's
// are), the growing total made V8 start full collections to free memory that collecting
// frees only later or never: a rank under PyTorch registered 20 GiB on 3328 comms, and 1024
// TCP comm pairs connected and closed twice made 37-50 full collections with their rings
// counted, 8-9 without (docs/performance.md, item 45). N-API has no call for such a store, so
// V8's is used; a napi_value is the slot of a v8::Local (N-API's own conversion copies it the
// same way).
napi_value uncountedView(napi_env, void* data, size_t size) {
  v8::Isolate* isolate = v8::Isolate::GetCurrent();
  std::unique_ptr<v8::BackingStore> store = v8::ArrayBuffer::NewBackingStore(data, size, v8::BackingStore::EmptyDeleter, nullptr);
  v8::Local<v8::ArrayBuffer> local = v8::ArrayBuffer::New(isolate, std::move(store));
  static_assert(sizeof(napi_value) == sizeof(local), "a napi_value is a v8::Local's slot");
  napi_value value;
  std::memcpy(&value, &local, sizeof value);
  return value;
}

}  // namespace

bool callPlugin(napi_env env, napi_async_context async, napi_value fn, const char* what, size_t argc,
                const napi_value* argv, napi_value* result) {
  Napi::Env e(env);
  napi_value global;
  napi_get_global(env, &global);
  napi_status st = napi_make_callback(env, async, global, fn, argc, argv, result);
  if (st == napi_ok && !e.IsExceptionPending()) return true;
  std::string why = "(no exception)";
  if (e.IsExceptionPending()) {
    Napi::Error err = e.GetAndClearPendingException();
    Napi::Value stack = err.Value().IsObject() ? err.Value().As<Napi::Object>().Get("stack") : err.Value();
    why = (stack.IsString() ? stack : err.Value()).ToString().Utf8Value();
  }
  log(kLogWarn, "the plugin threw in %s: %s", what, why.c_str());
  return false;
}

napi_value bindingInit(napi_env env, napi_value exports) {
  Napi::Env e(env);
  Napi::Object o(env, exports);
  o.Set("start", Napi::Function::New(e, Start, "start"));
  o.Set("loadFailed", Napi::Function::New(e, LoadFailed, "loadFailed"));
  o.Set("startThreads", Napi::Function::New(e, StartThreads, "startThreads"));
  o.Set("log", Napi::Function::New(e, Log, "log"));
  o.Set("setSpin", Napi::Function::New(e, SetSpin, "setSpin"));
  o.Set("now", Napi::Function::New(e, Now, "now"));
  o.Set("threadCpu", Napi::Function::New(e, ThreadCpu, "threadCpu"));
  o.Set("longest", Napi::Function::New(e, Longest, "longest"));
  o.Set("runWait", Napi::Function::New(e, RunWait, "runWait"));
  o.Set("busy", Napi::Function::New(e, Busy, "busy"));
  o.Set("earlyWakes", Napi::Function::New(e, EarlyWakes, "earlyWakes"));
  o.Set("wakes", Napi::Function::New(e, Wakes, "wakes"));
  o.Set("controlCalls", Napi::Function::New(e, ControlCalls, "controlCalls"));
  o.Set("wakeState", Napi::Function::New(e, WakeState, "wakeState"));
  o.Set("wakeSelf", Napi::Function::New(e, WakeSelf, "wakeSelf"));
  o.Set("traceOpen", Napi::Function::New(e, TraceOpen, "traceOpen"));
  o.Set("traceWrite", Napi::Function::New(e, TraceWrite, "traceWrite"));
  o.Set("timestamps", Napi::Function::New(e, Timestamps, "timestamps"));
  o.Set("thread", tIndex < 0 ? 0 : tIndex);
  engineSetRingView(uncountedView);
  engineRegister(env, exports);
  return exports;
}

void bindingSetThread(int index) { tIndex = index; }
int bindingThreadIndex() { return tIndex; }
bool tracing() { return g_trace.load(std::memory_order_relaxed); }
double traceNowUs() { return nowUs(); }

void markActivity() {
  if (!P || !P->spinNs) return;
  P->lastActivity = uv_hrtime();
  if (!P->spinning.load(std::memory_order_relaxed)) {
    uv_idle_start(&P->spin, onSpin);
    P->spinning.store(true, std::memory_order_seq_cst);
  }
}

bool pluginWatchFd(int fd) {
  if (!P || P->watch || !P->spinNs) return false;
  uv_loop_s* loop = nullptr;
  napi_get_uv_event_loop(P->env, &loop);
  auto* h = new uv_poll_t();
  if (!loop || uv_poll_init(loop, h, fd) != 0) {
    delete h;
    return false;
  }
  P->watch = h;
  P->watchFd = fd;
  uv_poll_start(h, UV_READABLE, [](uv_poll_t*, int, int) {
    // Takes the ready one-shot entries (they stay off until the thread sleeps again) and looks
    // for the message the I/O thread is about to hand over.
    epoll_event evs[64];
    if (epoll_wait(P->watchFd, evs, 64, 0) > 0) P->earlyWakes++;
    markActivity();
  });
  uv_unref(reinterpret_cast<uv_handle_t*>(h));  // keeps no loop alive
  return true;
}

void pluginWake(int thread) {
  Plugin* p = g_plugins[thread];
  if (p && !p->spinning.load(std::memory_order_seq_cst)) p->waker.wake();
}

bool pluginWakeState(int thread, bool* spinning, bool* pending, bool* readable) {
  Plugin* p = thread >= 0 && thread < kMaxProtocolThreads ? g_plugins[thread] : nullptr;
  if (!p) return false;
  *spinning = p->spinning.load(std::memory_order_seq_cst);
  *pending = p->waker.pending();
  *readable = p->waker.readable();
  return true;
}

// --- control calls ---

tsn_result_t jsInit(uint64_t commId, int trafficClass, bool legacy, uint32_t* ctxId, int* warmup) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("commId", Napi::BigInt::New(env, commId));
  a.Set("trafficClass", trafficClass);
  a.Set("legacy", legacy);
  tsn_result_t rc = control("init", a, &out);
  if (rc == TSN_SUCCESS) {
    *ctxId = u32(out, "ctx");
    *warmup = static_cast<int>(u32(out, "warmup"));
  }
  return rc;
}

tsn_result_t jsDevices(int* ndev) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object out;
  tsn_result_t rc = control("devices", Napi::Object::New(env), &out);
  if (rc == TSN_SUCCESS) *ndev = static_cast<int>(u32(out, "ndev"));
  return rc;
}

tsn_result_t jsGetProperties(int dev, tsn_props_t* props) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("dev", dev);
  tsn_result_t rc = control("getProperties", a, &out);
  if (rc != TSN_SUCCESS) return rc;
  Napi::Value pv = out.Get("props");
  if (!pv.IsObject()) {
    log(kLogWarn, "getProperties(%d): the plugin gave no properties", dev);
    return TSN_INTERNAL_ERROR;
  }
  Napi::Object p = pv.As<Napi::Object>();
  char* base = reinterpret_cast<char*>(props);
  for (int i = 0; i < tsn_props_field_count; i++) {
    const tsn_field_t& f = tsn_props_fields[i];
    Napi::Value v = p.Get(f.name);
    char* at = base + f.offset;
    if (f.kind == TSN_FIELD_STRING) {
      const char* s = v.IsString() ? intern(v.As<Napi::String>().Utf8Value()) : nullptr;
      memcpy(at, &s, sizeof s);
      continue;
    }
    if (f.kind == TSN_FIELD_VPROPS) {
      Napi::Object vp = v.IsObject() ? v.As<Napi::Object>() : Napi::Object::New(env);
      Napi::Value devs = vp.Get("devs");
      int nd = vp.Get("ndevs").IsNumber() ? vp.Get("ndevs").As<Napi::Number>().Int32Value() : 0;
      if (nd < 0 || nd > f.length) nd = 0;
      memcpy(at, &nd, sizeof nd);
      for (int k = 0; k < nd && devs.IsArray(); k++) {
        int d = devs.As<Napi::Array>().Get(k).As<Napi::Number>().Int32Value();
        memcpy(at + sizeof(int) * (1 + k), &d, sizeof d);
      }
      continue;
    }
    if (!v.IsNumber() && !v.IsBigInt()) {
      log(kLogWarn, "getProperties(%d): the plugin gave no value for %s", dev, f.name);
      return TSN_INTERNAL_ERROR;
    }
    double d = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : 0;
    switch (f.kind) {
      case TSN_FIELD_I16: { int16_t x = static_cast<int16_t>(d); memcpy(at, &x, sizeof x); break; }
      case TSN_FIELD_I32: { int32_t x = static_cast<int32_t>(d); memcpy(at, &x, sizeof x); break; }
      case TSN_FIELD_F32: { float x = static_cast<float>(d); memcpy(at, &x, sizeof x); break; }
      case TSN_FIELD_SIZE: { size_t x = static_cast<size_t>(d); memcpy(at, &x, sizeof x); break; }
      case TSN_FIELD_U64: {
        bool lossless;
        uint64_t x = v.IsBigInt() ? v.As<Napi::BigInt>().Uint64Value(&lossless) : static_cast<uint64_t>(d);
        memcpy(at, &x, sizeof x);
        break;
      }
    }
  }
  return TSN_SUCCESS;
}

tsn_result_t jsListen(uint32_t ctxId, int dev, void* handle, uint32_t* listenId) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("ctx", ctxId);
  a.Set("dev", dev);
  tsn_result_t rc = control("listen", a, &out);
  if (rc != TSN_SUCCESS) return rc;
  Napi::Value h = out.Get("handle");
  if (!h.IsTypedArray() || h.As<Napi::Uint8Array>().ByteLength() > TSN_HANDLE_SIZE) {
    log(kLogWarn, "listen: the plugin gave no handle of at most %d bytes", TSN_HANDLE_SIZE);
    return TSN_INTERNAL_ERROR;
  }
  Napi::Uint8Array bytes = h.As<Napi::Uint8Array>();
  memset(handle, 0, TSN_HANDLE_SIZE);
  memcpy(handle, bytes.Data(), bytes.ByteLength());
  *listenId = u32(out, "listen");
  return TSN_SUCCESS;
}

tsn_result_t jsConnect(uint32_t ctxId, int dev, int trafficClass, const void* handle, uint32_t* commId) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("ctx", ctxId);
  a.Set("dev", dev);
  a.Set("trafficClass", trafficClass);
  a.Set("handle", Napi::Buffer<uint8_t>::Copy(env, static_cast<const uint8_t*>(handle), TSN_HANDLE_SIZE));
  tsn_result_t rc = control("connect", a, &out);
  if (rc == TSN_SUCCESS) *commId = u32(out, "comm");
  return rc;
}

tsn_result_t jsAccept(uint32_t listenId, uint32_t* commId) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("listen", listenId);
  tsn_result_t rc = control("accept", a, &out);
  if (rc == TSN_SUCCESS) *commId = u32(out, "comm");
  return rc;
}

tsn_result_t jsAttachComm(Comm* comm) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("comm", comm->jsId);
  // The slot states test() reads; the plugin writes them when a request ends.
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, comm->status, sizeof comm->status, [](Napi::Env, void*) {});
  a.Set("status", ab);
  tsn_result_t rc = control("attach", a, &out);
  napi_ref ref;
  napi_create_reference(env, ab, 1, &ref);
  P->statusViews[comm->jsId] = ref;
  return rc;
}

tsn_result_t jsRegMr(Comm* comm, void* data, size_t size, int type, Mr* mr, int fd, uint64_t offset) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("comm", comm->jsId);
  a.Set("type", type);
  a.Set("size", static_cast<double>(size));
  a.Set("base", static_cast<double>(reinterpret_cast<uintptr_t>(data)));
  if (fd >= 0) {
    a.Set("fd", fd);
    a.Set("offset", static_cast<double>(offset));  // below the address, so exact below 2^53
  }
  // Host memory: a view of NCCL's memory, no copy; detached again at deregMr. GPU memory gets
  // none: JavaScript must never touch it.
  Napi::ArrayBuffer ab;
  if (type == TSN_PTR_HOST) {
    ab = Napi::ArrayBuffer(env, uncountedView(env, data, size));
    a.Set("buffer", ab);
  }
  tsn_result_t rc = control("regMr", a, &out);
  if (rc != TSN_SUCCESS) {
    if (!ab.IsEmpty()) ab.Detach();
    return rc;
  }
  napi_ref ref = nullptr;
  if (!ab.IsEmpty()) napi_create_reference(env, ab, 1, &ref);
  mr->jsBuffer = ref;
  mr->jsId = u32(out, "mr");
  return TSN_SUCCESS;
}

static void detach(napi_ref ref) {
  napi_value ab;
  if (ref && napi_get_reference_value(P->env, ref, &ab) == napi_ok && ab) napi_detach_arraybuffer(P->env, ab);
  if (ref) napi_delete_reference(P->env, ref);
}

tsn_result_t jsDeregMr(Comm* comm, Mr* mr) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("comm", comm->jsId);
  a.Set("mr", mr->jsId);
  tsn_result_t rc = control("deregMr", a, &out);
  // Whatever the plugin said, nothing may touch the memory once NCCL has it back.
  detach(static_cast<napi_ref>(mr->jsBuffer));
  mr->jsBuffer = nullptr;
  return rc;
}

static tsn_result_t closeCall(const char* op, const char* key, uint32_t id) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set(key, id);
  return control(op, a, &out);
}

tsn_result_t jsCloseComm(Comm* comm) {
  tsn_result_t rc = closeCall("close", "comm", comm->jsId);
  auto it = P->statusViews.find(comm->jsId);
  if (it != P->statusViews.end()) {
    Napi::Env env(P->env);
    Napi::HandleScope scope(env);
    detach(it->second);
    P->statusViews.erase(it);
  }
  return rc;
}
tsn_result_t jsCloseListen(uint32_t listenId) { return closeCall("closeListen", "listen", listenId); }
tsn_result_t jsFinalize(uint32_t ctxId) { return closeCall("finalize", "ctx", ctxId); }

tsn_result_t jsSetNetAttr(uint32_t ctxId, const tsn_net_attr_t* attr) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("ctx", ctxId);
  Napi::Object send = Napi::Object::New(env), recv = Napi::Object::New(env);
  for (auto [o, side] : {std::pair{send, &attr->send}, std::pair{recv, &attr->recv}}) {
    o.Set("maxConcurrentPeers", side->maxConcurrentPeers);
    o.Set("minConcurrentPeers", side->minConcurrentPeers);
    o.Set("maxFlowsPerPeer", side->maxFlowsPerPeer);
    o.Set("minFlowsPerPeer", side->minFlowsPerPeer);
  }
  a.Set("send", send);
  a.Set("recv", recv);
  a.Set("op", attr->op);
  a.Set("algo", attr->algo);
  a.Set("proto", attr->proto);
  return control("setNetAttr", a, &out);
}

}  // namespace tsn
