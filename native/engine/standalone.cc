// The native engine as a plain Node addon (build/tsnet_engine.node), for tests that drive the
// real I/O threads and rings from a Node process without embedding (test/engine/,
// test/integration/). It stands in for what the plugin's binding gives the engine: the
// calling thread's protocol-thread index, waking a protocol thread (tests poll instead), and
// logging (stderr). A few test-only helpers name memory and sockets (addressOf, socketPair)
// and look inside the engine (lanes, noDelay).
#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#include <napi.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "../internal.h"
#include "engine_internal.h"

namespace tsn {

static thread_local int tIndex = 0;
static bool verbose = false;

int bindingThreadIndex() { return tIndex; }
void pluginWake(int) {}
bool pluginWatchFd(int) { return false; }
bool pluginWakeState(int, bool*, bool*, bool*) { return false; }

void logMessage(int level, unsigned long, const char* msg) {
  if (level == kLogWarn || verbose) fprintf(stderr, "NET/tsnet %s %s\n", level == kLogWarn ? "WARN" : "INFO", msg);
}

void log(int level, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  logMessage(level, 0, buf);
}

}  // namespace tsn

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  tsn::engineRegister(env, exports);
  // setThread(i): the protocol-thread index this Node thread plays (each port is one).
  exports.Set("setThread", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    tsn::tIndex = info[0].As<Napi::Number>().Int32Value();
    return info.Env().Undefined();
  }));
  exports.Set("setVerbose", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    tsn::verbose = info[0].ToBoolean().Value();
    return info.Env().Undefined();
  }));
  // Test-only helpers (the plugin's binding has none of these).
  // addressOf(arrayBuffer): where its bytes live, so tests can name them in submissions.
  exports.Set("addressOf", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    if (info.Length() < 1 || !info[0].IsArrayBuffer()) {
      Napi::TypeError::New(info.Env(), "addressOf(arrayBuffer)").ThrowAsJavaScriptException();
      return info.Env().Undefined();
    }
    return Napi::Number::New(info.Env(), static_cast<double>(reinterpret_cast<uintptr_t>(info[0].As<Napi::ArrayBuffer>().Data())));
  }));
  // socketPair(): two connected AF_UNIX stream sockets [fd, fd] (blocking, close-on-exec).
  exports.Set("socketPair", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
      Napi::Error::New(info.Env(), std::string("socketpair: ") + strerror(errno)).ThrowAsJavaScriptException();
      return info.Env().Undefined();
    }
    Napi::Array out = Napi::Array::New(info.Env(), 2);
    out.Set(0u, sv[0]);
    out.Set(1u, sv[1]);
    return out;
  }));
  // lanes(): lanes the engine has not freed yet (a closing lane counts until its I/O thread frees it).
  exports.Set("lanes", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    int n = 0;
    if (tsn::E)
      for (uint32_t c = 0; c < tsn::kLaneChunks; c++) {
        tsn::Lane** chunk = tsn::E->chunks[c].load(std::memory_order_acquire);
        if (!chunk) break;
        for (uint32_t i = 0; i < tsn::kLaneChunk; i++)
          if (__atomic_load_n(&chunk[i], __ATOMIC_ACQUIRE)) n++;
      }
    return Napi::Number::New(info.Env(), n);
  }));
  // ioTestStall(thread, ms[, lane]): I/O thread `thread` sleeps ms as if inside a provider call
  // that does not return (for ioStalls' tests); with a libfabric lane of that thread, inside
  // that lane's next poll, with its lock held.
  exports.Set("ioTestStall", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    uint32_t t = info[0].As<Napi::Number>().Uint32Value();
    tsn::Lane* l = info.Length() > 2 && tsn::E ? tsn::laneOf(info[2].As<Napi::Number>().Uint32Value()) : nullptr;
    if (tsn::E && t < tsn::E->threads.size()) {
      tsn::Admin* a = new tsn::Admin{nullptr, tsn::Admin::kStall, l, info[1].As<Napi::Number>().Uint32Value()};
      tsn::postAdmin(tsn::E->threads[t], a);
    }
    return info.Env().Undefined();
  }));
  // noDelay(lane): TCP_NODELAY of the lane's socket (1 or 0), -1 when it has none or is not TCP.
  exports.Set("noDelay", Napi::Function::New(env, [](const Napi::CallbackInfo& info) {
    int v = -1;
    tsn::Lane* l = tsn::E ? tsn::laneOf(info[0].As<Napi::Number>().Uint32Value()) : nullptr;
    if (l) {
      std::lock_guard<std::mutex> g(l->mu);
      socklen_t len = sizeof v;
      if (l->fd < 0 || getsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &v, &len) < 0) v = -1;
    }
    return Napi::Number::New(info.Env(), v);
  }));
  return exports;
}

NODE_API_MODULE(tsnet_engine, Init)
