// The `tsnet` binding (node-addon-api). The plugin thread enters JavaScript only here:
// the wake-up handler drains posted requests into a shared mailbox and runs control calls.
#include "binding.h"

#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#include <napi.h>
#include <uv.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "../embed/host.h"
#include "io.h"
#include "waker.h"

namespace tsn {
namespace {

// Mailbox record of one posted request, in doubles: op, comm id, slot, n, then per buffer
// region id, offset, size, tag. The plugin reads it as a Float64Array (plugin/native.ts).
constexpr int kRecordHead = 4;
constexpr int kRecordStride = kRecordHead + 4 * TSN_MAX_RECVS;
constexpr int kMailboxRecords = 1024;

struct Plugin {
  napi_env env = nullptr;
  Napi::FunctionReference control;  // control(op, args) -> { result, ... }
  Napi::FunctionReference data;     // data(count): read count records from the mailbox
  Napi::Reference<Napi::Float64Array> mailboxRef;
  double* mailbox = nullptr;
  napi_async_context async = nullptr;
  Waker waker;
  std::unordered_map<uint32_t, Comm*> comms;
  // Busy-poll window: after activity the loop polls without sleeping for spinNs, so a reply
  // or the next post is seen without an epoll wake-up; then it sleeps again.
  uv_idle_t spin;
  std::atomic<bool> spinning{false};
  uint64_t spinNs = 0;
  uint64_t lastActivity = 0;
};
Plugin* P = nullptr;

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

// Drains posted requests into the mailbox, calling the plugin once per full mailbox.
void drainPosted() {
  Request* r = hostTakePosted();
  Napi::Env env(P->env);
  while (r) {
    int count = 0;
    for (; r && count < kMailboxRecords; r = r->next, count++) {
      double* rec = P->mailbox + count * kRecordStride;
      rec[0] = r->op;
      rec[1] = r->comm->jsId;
      rec[2] = r->index;
      rec[3] = r->n;
      for (int i = 0; i < r->n; i++) {
        double* b = rec + kRecordHead + 4 * i;
        b[0] = r->bufs[i].mrId;
        b[1] = static_cast<double>(r->bufs[i].offset);
        b[2] = static_cast<double>(r->bufs[i].size);
        b[3] = r->bufs[i].tag;
      }
    }
    callJs(P->data, "data", {Napi::Number::New(env, count)}, nullptr);
  }
}

void pump();

// The busy-poll window: while it is open nobody wakes this thread, so it looks for work itself.
void onSpin(uv_idle_t*) {
  ioPoll();
  if (hostHasWork()) pump();
  if (uv_hrtime() - P->lastActivity < P->spinNs) return;
  uv_idle_stop(&P->spin);
  P->spinning.store(false, std::memory_order_seq_cst);
  // Work posted just before the flag dropped found it set and sent no wake-up.
  ioPoll();
  if (hostHasWork()) pump();
}

// Posters call this after queueing work.
void wakePlugin() {
  if (!P->spinning.load(std::memory_order_seq_cst)) P->waker.wake();
}

void pump() {
  markActivity();
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  do drainPosted();
  while (hostRunOneControl(drainPosted));
}

// --- functions the plugin calls ---

Napi::Value Start(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (P) {
    Napi::Error::New(env, "tsnet binding already started").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Object h = info[0].As<Napi::Object>();
  if (!h.IsObject() || !h.Get("control").IsFunction() || !h.Get("data").IsFunction()) {
    Napi::TypeError::New(env, "start({control, data}) needs two functions").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  P = new Plugin();
  P->env = env;
  P->control = Napi::Persistent(h.Get("control").As<Napi::Function>());
  P->data = Napi::Persistent(h.Get("data").As<Napi::Function>());
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
  hostReady(wakePlugin);
  Napi::Object out = Napi::Object::New(env);
  out.Set("mailbox", mailbox);
  out.Set("recordStride", kRecordStride);
  out.Set("recordHead", kRecordHead);
  out.Set("slotsPerComm", kSlotsPerComm);
  return out;
}

Napi::Value LoadFailed(const Napi::CallbackInfo& info) {
  hostLoadFailed(info[0].ToString().Utf8Value());
  return info.Env().Undefined();
}

// complete(commId, slot, result, size0, size1, ...): ends a posted request.
Napi::Value Complete(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t commId = info[0].As<Napi::Number>().Uint32Value();
  uint32_t slot = info[1].As<Napi::Number>().Uint32Value();
  int result = info[2].As<Napi::Number>().Int32Value();
  auto it = P->comms.find(commId);
  if (it == P->comms.end() || slot >= static_cast<uint32_t>(kSlotsPerComm)) {
    Napi::RangeError::New(env, "complete: no such request").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Request* r = &it->second->slots[slot];
  if (r->state.load(std::memory_order_relaxed) != kPosted) {
    Napi::Error::New(env, "complete: request is not in flight").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  int n = static_cast<int>(info.Length()) - 3;
  for (int i = 0; i < n && i < TSN_MAX_RECVS; i++) r->sizes[i] = info[3 + i].As<Napi::Number>().Int32Value();
  r->result = result;
  r->state.store(result == TSN_SUCCESS ? kDone : kFailed, std::memory_order_release);
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
  o.Set("complete", Napi::Function::New(e, Complete, "complete"));
  o.Set("log", Napi::Function::New(e, Log, "log"));
  o.Set("setSpin", Napi::Function::New(e, SetSpin, "setSpin"));
  ioRegister(env, exports);
  return exports;
}

void markActivity() {
  if (!P || !P->spinNs) return;
  P->lastActivity = uv_hrtime();
  if (!P->spinning.load(std::memory_order_relaxed)) {
    uv_idle_start(&P->spin, onSpin);
    P->spinning.store(true, std::memory_order_seq_cst);
  }
}

bool pluginPolling() { return P && P->spinning.load(std::memory_order_seq_cst); }

void commRegister(Comm* comm) { P->comms[comm->jsId] = comm; }
void commForget(Comm* comm) { P->comms.erase(comm->jsId); }

// --- control calls ---

tsn_result_t jsInit(uint64_t commId, int trafficClass, bool legacy, uint32_t* ctxId) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("commId", Napi::BigInt::New(env, commId));
  a.Set("trafficClass", trafficClass);
  a.Set("legacy", legacy);
  tsn_result_t rc = control("init", a, &out);
  if (rc == TSN_SUCCESS) *ctxId = u32(out, "ctx");
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

tsn_result_t jsRegMr(Comm* comm, void* data, size_t size, int type, Mr* mr) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("comm", comm->jsId);
  a.Set("type", type);
  a.Set("size", static_cast<double>(size));
  // A view of NCCL's memory, no copy; detached again at deregMr.
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, data, size);
  a.Set("buffer", ab);
  tsn_result_t rc = control("regMr", a, &out);
  if (rc != TSN_SUCCESS) {
    ab.Detach();
    return rc;
  }
  napi_ref ref;
  napi_create_reference(env, ab, 1, &ref);
  mr->jsBuffer = ref;
  mr->jsId = u32(out, "mr");
  return TSN_SUCCESS;
}

tsn_result_t jsDeregMr(Comm* comm, Mr* mr) {
  Napi::Env env(P->env);
  Napi::HandleScope scope(env);
  Napi::Object a = Napi::Object::New(env), out;
  a.Set("comm", comm->jsId);
  a.Set("mr", mr->jsId);
  tsn_result_t rc = control("deregMr", a, &out);
  // Whatever the plugin said, nothing may touch the memory once NCCL has it back.
  napi_ref ref = static_cast<napi_ref>(mr->jsBuffer);
  napi_value ab;
  if (ref && napi_get_reference_value(env, ref, &ab) == napi_ok && ab) napi_detach_arraybuffer(env, ab);
  if (ref) napi_delete_reference(env, ref);
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

tsn_result_t jsCloseComm(Comm* comm) { return closeCall("close", "comm", comm->jsId); }
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
