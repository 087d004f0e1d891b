// The engine's functions as protocol threads see them (binding `tsnet`): start the I/O threads,
// get this thread's rings, hand sockets over, wake a sleeping I/O thread, close and cancel.
// Submissions and completions themselves never pass through here: JavaScript reads and writes
// the rings directly (plugin/engine/).
#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <napi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "../binding.h"
#include "../internal.h"
#include "../wake_delays_js.h"
#include "engine_internal.h"
#include "../stacks.h"
#include "../ofi/ofi.h"

namespace tsn {
namespace {

Napi::Value fail(Napi::Env env, const std::string& msg, bool range = false) {
  if (range) Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  else Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

// What a failure for want of file descriptors comes from, and what to do about it (the only
// copy of these words: fdNote() gives them to JavaScript for Node's own errors).
std::string descriptorNote(int err) {
  if (err == ENFILE) return " (ENFILE: the system's table of open files is full)";
  if (err != EMFILE) return "";
  rlimit r{};
  std::string limit = getrlimit(RLIMIT_NOFILE, &r) == 0 ? std::to_string(r.rlim_cur) : "unknown";
  return " (EMFILE: the process has every file descriptor its limit allows open, RLIMIT_NOFILE " + limit +
         "; over TCP each comm holds 1 + TSNET_NSOCKS descriptors: raise the limit, as `ulimit -n`, or use fewer sockets)";
}

// errno's name for the errors the engine's calls give (strerrorname_np needs glibc 2.32).
const char* errnoName(int err) {
  switch (err) {
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOMEM: return "ENOMEM";
    case EAGAIN: return "EAGAIN";
    case EBADF: return "EBADF";
    case EINVAL: return "EINVAL";
    case ENOTSOCK: return "ENOTSOCK";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOSPC: return "ENOSPC";
    default: return "ESYSTEM";  // any errno: what plugin/errors.ts needs is that it is one
  }
}

// A failed system call as a JavaScript error whose code is errno's name (EMFILE, ...): the
// plugin reports it to NCCL as a system error (plugin/errors.ts, resultOf).
Napi::Value sysFail(Napi::Env env, const std::string& what, int err) {
  Napi::Error e = Napi::Error::New(env, what + ": " + strerror(err) + descriptorNote(err));
  e.Set("errno", Napi::Number::New(env, -err));
  e.Set("code", Napi::String::New(env, errnoName(err)));
  e.ThrowAsJavaScriptException();
  return env.Undefined();
}

// fdNote(code): for Node's errors with code EMFILE or ENFILE, the words above; "" otherwise.
Napi::Value FdNote(const Napi::CallbackInfo& info) {
  std::string code = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
  return Napi::String::New(info.Env(), descriptorNote(code == "EMFILE" ? EMFILE : code == "ENFILE" ? ENFILE : 0));
}

// How a receive ring's ArrayBuffer is made (engineSetRingView): by default N-API's external
// ArrayBuffer, which V8 counts as external memory; the plugin's library makes one V8 does not
// count, since the ring is freed at ioClose and not by V8 (binding.cc, uncountedView).
std::atomic<RingViewMaker> g_ringView{nullptr};  // every protocol thread's binding sets the same one

static napi_value ringView(napi_env env, void* p, size_t bytes) {
  if (RingViewMaker make = g_ringView.load(std::memory_order_relaxed)) return make(env, p, bytes);
  napi_value ab = nullptr;
  napi_create_external_arraybuffer(env, p, bytes, [](napi_env, void*, void*) {}, nullptr, &ab);
  return ab;
}

// JavaScript's hold on a control lane's ring goes: the ArrayBuffer is detached (every view of it
// reads as empty from now on) and its reference to the memory released, which the lane's own
// reference outlives while an I/O thread may still write there. Before the lane's close reaches
// its I/O thread, which may free the lane.
static void dropRing(napi_env env, Lane* l) {
  if (!l->rxRef) return;
  napi_ref ref = static_cast<napi_ref>(l->rxRef);
  napi_value ab = nullptr;
  // Empty: V8 collected the ArrayBuffer, and its finalizer released the memory (or will).
  if (napi_get_reference_value(env, ref, &ab) == napi_ok && ab) {
    RxView* v = l->rxView;
    if (!v->dropped) {
      v->dropped = true;
      napi_detach_arraybuffer(env, ab);
      rxRelease(v->mem);
    }
  }
  napi_delete_reference(env, ref);
  l->rxRef = nullptr;
  l->rxView = nullptr;
}

// Memory the engine owns for the process's life, seen from JavaScript without a copy.
Napi::ArrayBuffer view(Napi::Env env, void* p, size_t bytes) {
  return Napi::ArrayBuffer::New(env, p, bytes, [](Napi::Env, void*) {});
}

bool number(const Napi::CallbackInfo& info, size_t i, double* out) {
  if (info.Length() <= i || !info[i].IsNumber()) return false;
  *out = info[i].As<Napi::Number>().DoubleValue();
  return true;
}

// The calling thread's lane with this id, or nullptr after throwing.
Lane* ownLane(const Napi::CallbackInfo& info, const char* fn) {
  Napi::Env env = info.Env();
  double id;
  if (!E) return fail(env, std::string(fn) + ": call ioStart first"), nullptr;
  if (!number(info, 0, &id)) return fail(env, std::string(fn) + ": the first argument must be a lane id"), nullptr;
  if (closedHere().count(static_cast<uint32_t>(id)))  // freed, or soon: not to be read
    return fail(env, std::string(fn) + ": lane " + std::to_string(static_cast<uint32_t>(id)) + " was closed already", true), nullptr;
  Lane* l = laneOf(static_cast<uint32_t>(id));
  // quiet: this thread closed it already (only this thread sets it); the I/O thread frees it soon.
  if (!l || l->port != bindingThreadIndex() || l->quiet)
    return fail(env, std::string(fn) + ": no such lane of this thread (closed?)", true), nullptr;
  return l;
}

// ioStart(threads, spinUs, lingerMs, pollUs): starts the I/O threads, once per process.
Napi::Value IoStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double n, spinUs, lingerMs, pollUs;
  if (!number(info, 0, &n) || !number(info, 1, &spinUs) || !number(info, 2, &lingerMs) || !number(info, 3, &pollUs))
    return fail(env, "ioStart(threads, spinUs, lingerMs, pollUs) needs four numbers");
  if (E) return Napi::Number::New(env, static_cast<double>(E->threads.size()));
  if (n < 1 || n > kMaxIoThreads) return fail(env, "ioStart: threads must be 1.." + std::to_string(kMaxIoThreads), true);
  std::string why;
  if (!startThreads(static_cast<int>(n), spinUs, lingerMs, pollUs, &why)) return sysFail(env, "ioStart: " + why, errno);
  log(kLogInfo, "io: started %d I/O thread%s", static_cast<int>(n), n == 1 ? "" : "s");
  return Napi::Number::New(env, n);
}

// ioPort(): the calling protocol thread's rings, made on first call.
Napi::Value IoPort(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!E) return fail(env, "ioPort: call ioStart first");
  int p = bindingThreadIndex();
  if (p < 0 || p >= kMaxPorts) return fail(env, "ioPort: not a protocol thread", true);
  Port* port = E->ports[p].load(std::memory_order_acquire);
  int n = static_cast<int>(E->threads.size());
  if (!port) {
    port = new Port();
    for (int t = 0; t < n; t++)
      if (!port->sub[t].init(kSubRecords) || !port->cq[t].init(kCqRecords)) return fail(env, "ioPort: out of memory");
    E->ports[p].store(port, std::memory_order_release);
  }
  Napi::Object out = Napi::Object::New(env);
  Napi::Array subs = Napi::Array::New(env, n), cqs = Napi::Array::New(env, n);
  for (int t = 0; t < n; t++) {
    subs.Set(t, view(env, port->sub[t].hdr, port->sub[t].bytes));
    cqs.Set(t, view(env, port->cq[t].hdr, port->cq[t].bytes));
  }
  out.Set("sub", subs);
  out.Set("cq", cqs);
  out.Set("sleeping", Napi::Int32Array::New(env, n, view(env, E->sleeping, sizeof(int32_t) * kMaxIoThreads), 0));
  out.Set("port", p);
  return out;
}

// --- the TCP handshake without Node's sockets (plugin/transports/tcp/dial.ts, index.ts) ---
// Each call is one non-blocking system call on the protocol thread, made when a watch on the
// socket fires (fdWatch, below) or at the watchdog's tick: no Node socket, stream or callback
// per connection. Failures come back as -errno (tcpDial, tcpListen: { errno, syscall }) for the
// plugin to word.

// A numeric address (IPv4, or IPv6 with an optional %scope) and port, or false.
bool numericAddress(const std::string& host, int port, sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || !res) return false;
  memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

Napi::Value dialFailed(Napi::Env env, int err, const char* syscall) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("errno", -err);
  o.Set("syscall", syscall);
  return o;
}

// tcpDial(address, port, local?): a non-blocking, close-on-exec TCP socket whose connect to
// address:port has begun, bound first to local (port 0) when given. Returns its fd, or
// { errno, syscall } when a call failed (the socket is closed then). TCP_NODELAY comes with
// ioAdopt: the handshake writes one greeting, which Nagle never holds back.
Napi::Value TcpDial(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double portD;
  if (info.Length() < 2 || !info[0].IsString() || !number(info, 1, &portD) || (info.Length() > 2 && !info[2].IsString() && !info[2].IsUndefined()))
    return fail(env, "tcpDial(address, port, local?) needs an address, a port and an optional local address");
  std::string host = info[0].As<Napi::String>().Utf8Value();
  int port = static_cast<int>(portD);
  if (portD != port || port < 0 || port > 65535) return fail(env, "tcpDial: the port must be 0..65535", true);  // 0: the kernel refuses
  sockaddr_storage to{}, from{};
  socklen_t toLen = 0, fromLen = 0;
  if (!numericAddress(host, port, &to, &toLen)) return fail(env, "tcpDial: " + host + " is not a numeric address", true);
  bool bindFirst = info.Length() > 2 && info[2].IsString();
  if (bindFirst) {
    std::string local = info[2].As<Napi::String>().Utf8Value();
    if (!numericAddress(local, 0, &from, &fromLen)) return fail(env, "tcpDial: " + local + " is not a numeric address", true);
  }
  int fd = socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return dialFailed(env, errno, "socket");
  int one = 1;
  if (bindFirst) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as libuv binds
  if (bindFirst && bind(fd, reinterpret_cast<sockaddr*>(&from), fromLen) < 0) {
    int err = errno;
    close(fd);
    return dialFailed(env, err, "bind");
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), toLen) < 0 && errno != EINPROGRESS) {
    int err = errno;
    close(fd);
    return dialFailed(env, err, "connect");
  }
  return Napi::Number::New(env, fd);
}

int fdArg(const Napi::CallbackInfo& info) {
  double fd;
  if (!number(info, 0, &fd) || fd < 0 || fd != static_cast<int>(fd)) return -1;
  return static_cast<int>(fd);
}

// tcpDialed(fd): 1 once the connect completed, 0 while it is in progress, -errno when it failed.
Napi::Value TcpDialed(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = fdArg(info);
  if (fd < 0) return fail(env, "tcpDialed(fd) needs a file descriptor");
  pollfd p{fd, POLLOUT, 0};
  int n = poll(&p, 1, 0);
  if (n < 0) return Napi::Number::New(env, -errno);
  if (n == 0) return Napi::Number::New(env, 0);
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return Napi::Number::New(env, -errno);
  if (err) return Napi::Number::New(env, -err);
  if (p.revents & POLLNVAL) return Napi::Number::New(env, -EBADF);
  // Connected and already shut both ways (a listener that closed it at once), or an error
  // read before: either way not a socket to greet on.
  if (p.revents & (POLLHUP | POLLERR)) return Napi::Number::New(env, -ECONNRESET);
  return Napi::Number::New(env, p.revents & POLLOUT ? 1 : 0);
}

// The bytes of a Uint8Array argument, or false after throwing.
bool bytesArg(const Napi::CallbackInfo& info, size_t i, const char* fn, uint8_t** p, size_t* n) {
  if (info.Length() <= i || !info[i].IsTypedArray() || info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    fail(info.Env(), std::string(fn) + ": the second argument must be a Uint8Array");
    return false;
  }
  Napi::Uint8Array a = info[i].As<Napi::Uint8Array>();
  *p = a.Data();
  *n = a.ByteLength();
  return true;
}

// One send(2) or recv(2) of a Uint8Array's bytes without blocking: the bytes moved (recv: 0 when
// the peer closed), or -errno (-EAGAIN: not now).
Napi::Value fdMove(const Napi::CallbackInfo& info, const char* fn, bool out) {
  Napi::Env env = info.Env();
  int fd = fdArg(info);
  uint8_t* p;
  size_t n;
  if (fd < 0) return fail(env, std::string(fn) + " needs a file descriptor");
  if (!bytesArg(info, 1, fn, &p, &n)) return env.Undefined();
  ssize_t r = out ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, p, n, MSG_DONTWAIT);
  return Napi::Number::New(env, r < 0 ? -errno : static_cast<double>(r));
}

// fdSend(fd, bytes): what send(2) took (MSG_NOSIGNAL). fdRecv(fd, into): what recv(2) read into
// the array, never more than it holds.
Napi::Value FdSend(const Napi::CallbackInfo& info) { return fdMove(info, "fdSend", true); }
Napi::Value FdRecv(const Napi::CallbackInfo& info) { return fdMove(info, "fdRecv", false); }

// tcpListen(): a non-blocking, close-on-exec TCP socket listening on every address (IPv6 and
// IPv4 where the host has IPv6, else IPv4) on a port the kernel picks, backlog 1024: { fd, port },
// or { errno, syscall }.
Napi::Value TcpListen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_storage a{};
  socklen_t len;
  if (fd >= 0) {
    int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_any;
    len = sizeof *a6;
  } else if (errno == EAFNOSUPPORT) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof *a4;
  }
  if (fd < 0) return dialFailed(env, errno, "socket");
  // As libuv binds (Node's listeners had it): a port whose last connections linger in TIME_WAIT
  // is free to take. Where thousands of comms share one address's ports (every rank of a host
  // over loopback, five sockets a comm), the port space runs short, and each port counts.
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) < 0 || listen(fd, 1024) < 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) < 0) {
    int err = errno;
    close(fd);
    return dialFailed(env, err, "listen");
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("fd", fd);
  o.Set("port", ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port));  // sin6_port: the same offset
  return o;
}

// "address:port" of a socket address (IPv4-mapped IPv6 written as Node writes it).
std::string addressText(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN + 8] = "?";
  char serv[16] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&a), a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in), host,
              sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string(host) + ":" + serv;
}

// A descriptor kept open to be closed when the process is out of them: the listener then takes
// the waiting connection and closes it, so that its connector fails at once instead of at its
// timeout (libuv's way, which Node's listeners had).
thread_local int tReserveFd = -2;

// tcpAccept(fd): the next waiting connection, non-blocking and close-on-exec: { fd, from }, or
// -errno (-EAGAIN: none waits). Out of descriptors (-EMFILE, -ENFILE) that connection was closed.
Napi::Value TcpAccept(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int lfd = fdArg(info);
  if (lfd < 0) return fail(env, "tcpAccept(fd) needs a file descriptor");
  if (tReserveFd == -2) tReserveFd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int fd = accept4(lfd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if ((err == EMFILE || err == ENFILE) && tReserveFd >= 0) {
      close(tReserveFd);
      int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) close(c);
      tReserveFd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    return Napi::Number::New(env, -err);
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("fd", fd);
  o.Set("from", addressText(a));
  return o;
}

// --- watching a socket from the protocol thread's event loop ---
// fdWatch(fd, writable): calls the handler set by fdWatchHandler(fn) with the watch's id
// whenever fd is readable (or writable, or in error) until fdUnwatch(id), which must come before
// the fd is closed. The handler gets (id) in a callback of its own (node::MakeCallback).
struct WatchedFd {
  uv_poll_t h;
  uint32_t id;
};
struct Watches {
  napi_env env = nullptr;
  napi_ref handler = nullptr;
  napi_async_context async = nullptr;
  uint32_t next = 1;
  std::unordered_map<uint32_t, WatchedFd*> live;
};
thread_local Watches* tWatches = nullptr;

void onWatched(uv_poll_t* h, int, int) {
  Watches* w = tWatches;
  auto* fw = static_cast<WatchedFd*>(h->data);
  if (!w || !w->handler) return;
  Napi::Env env(w->env);
  Napi::HandleScope scope(env);
  napi_value fn, recv, arg, res;
  napi_get_reference_value(w->env, w->handler, &fn);
  napi_get_global(w->env, &recv);
  napi_create_uint32(w->env, fw->id, &arg);
  if (napi_make_callback(w->env, w->async, recv, fn, 1, &arg, &res) != napi_ok) {
    // The handler catches what the plugin throws: this is the binding failing. The watch stops,
    // so that a socket that stays ready cannot repeat it on every pass of the loop; the
    // connection then waits for its connect or accept calls and the watchdog's tick.
    std::string why = env.IsExceptionPending() ? env.GetAndClearPendingException().Message() : "no reason given";
    uv_poll_stop(h);
    log(kLogWarn, "a socket's watch (id %u) failed to call the plugin: %s; it is stopped", fw->id, why.c_str());
  }
}

Napi::Value FdWatchHandler(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsFunction()) return fail(env, "fdWatchHandler(fn) needs a function");
  if (!tWatches) tWatches = new Watches();
  Watches* w = tWatches;
  if (w->handler) napi_delete_reference(env, w->handler);
  w->env = env;
  napi_create_reference(env, info[0], 1, &w->handler);
  if (!w->async) {
    napi_value name;
    napi_create_string_utf8(env, "tsnet-fd-watch", NAPI_AUTO_LENGTH, &name);
    napi_async_init(env, nullptr, name, &w->async);
  }
  return env.Undefined();
}

Napi::Value FdWatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = fdArg(info);
  if (fd < 0 || info.Length() < 2 || !info[1].IsBoolean()) return fail(env, "fdWatch(fd, writable) needs a file descriptor and a boolean");
  if (!tWatches || !tWatches->handler) return fail(env, "fdWatch: call fdWatchHandler first");
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || !loop) return fail(env, "fdWatch: no event loop");
  auto* fw = new WatchedFd();
  fw->id = tWatches->next++;
  if (tWatches->next == 0) tWatches->next = 1;
  int rc = uv_poll_init(loop, &fw->h, fd);
  if (rc != 0) {
    delete fw;
    return sysFail(env, "fdWatch", -rc);
  }
  fw->h.data = fw;
  rc = uv_poll_start(&fw->h, UV_READABLE | (info[1].As<Napi::Boolean>().Value() ? UV_WRITABLE : 0), onWatched);
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&fw->h), [](uv_handle_t* h) { delete static_cast<WatchedFd*>(h->data); });
    return sysFail(env, "fdWatch", -rc);
  }
  uv_unref(reinterpret_cast<uv_handle_t*>(&fw->h));  // a handshake keeps no process alive
  tWatches->live[fw->id] = fw;
  return Napi::Number::New(env, fw->id);
}

// fdWatchWritable(id, writable): whether the watch also wakes for writable (a connect done).
Napi::Value FdWatchWritable(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double id;
  if (!number(info, 0, &id) || info.Length() < 2 || !info[1].IsBoolean()) return fail(env, "fdWatchWritable(id, writable) needs an id and a boolean");
  if (!tWatches) return env.Undefined();
  auto it = tWatches->live.find(static_cast<uint32_t>(id));
  if (it == tWatches->live.end()) return env.Undefined();
  uv_poll_start(&it->second->h, UV_READABLE | (info[1].As<Napi::Boolean>().Value() ? UV_WRITABLE : 0), onWatched);
  return env.Undefined();
}

Napi::Value FdUnwatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double id;
  if (!number(info, 0, &id)) return fail(env, "fdUnwatch(id) needs an id");
  if (!tWatches) return env.Undefined();
  auto it = tWatches->live.find(static_cast<uint32_t>(id));
  if (it == tWatches->live.end()) return env.Undefined();
  WatchedFd* fw = it->second;
  tWatches->live.erase(it);
  uv_poll_stop(&fw->h);
  uv_close(reinterpret_cast<uv_handle_t*>(&fw->h), [](uv_handle_t* h) { delete static_cast<WatchedFd*>(h->data); });
  return env.Undefined();
}

// ioAdopt(fd, thread, link, rxBytes): takes over a connected stream socket (dup'd; the caller
// closes its own) on I/O thread `thread` (-1: round robin). rxBytes > 0 (a power of two) makes it
// a control lane whose bytes fill a receive ring: { lane, rx } with rx the ring's memory (header,
// then data), owned by that ArrayBuffer.
Napi::Value IoAdopt(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double fdD, threadD, linkD, rxD;
  if (!E) return fail(env, "ioAdopt: call ioStart first");
  if (!number(info, 0, &fdD) || !number(info, 1, &threadD) || !number(info, 2, &linkD) || !number(info, 3, &rxD))
    return fail(env, "ioAdopt(fd, thread, link, rxBytes) needs four numbers");
  int p = bindingThreadIndex();
  if (p < 0 || !E->ports[p].load()) return fail(env, "ioAdopt: call ioPort first");
  int n = static_cast<int>(E->threads.size());
  static std::atomic<uint32_t> rr{0};
  int ti = threadD < 0 ? static_cast<int>(rr++ % n) : static_cast<int>(threadD);
  if (ti < 0 || ti >= n) return fail(env, "ioAdopt: no such I/O thread", true);
  uint32_t rxBytes = static_cast<uint32_t>(rxD);
  if (rxD < 0 || rxD > (1u << 30) || (rxBytes & (rxBytes - 1))) return fail(env, "ioAdopt: rxBytes must be 0 or a power of two", true);
  int fd = static_cast<int>(fdD);
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0) return sysFail(env, "ioAdopt: not a socket", errno);
  if (type != SOCK_STREAM) return fail(env, "ioAdopt: not a stream socket");
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) return sysFail(env, "ioAdopt: dup", errno);
  int fl = fcntl(mine, F_GETFL);
  if (fl < 0 || fcntl(mine, F_SETFL, fl | O_NONBLOCK) < 0) {
    int err = errno;
    close(mine);
    return sysFail(env, "ioAdopt: O_NONBLOCK", err);
  }
  int one = 1;
  setsockopt(mine, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // fails harmlessly on a Unix socket
  void* mem = nullptr;  // the receive ring (up to 1 GiB): a process out of memory gets an error, not a fault
  const size_t memBytes = sizeof(tsn_rx_hdr_t) + rxBytes;
  if (rxBytes && !(mem = pagesAlloc(memBytes))) {
    int err = errno;
    close(mine);
    return sysFail(env, "ioAdopt: a receive ring of " + std::to_string(rxBytes) + " bytes", err ? err : ENOMEM);
  }
  // The lane and JavaScript share the ring: it goes when the lane has been freed and
  // JavaScript's hold dropped, whichever comes last. The hold goes at ioClose (dropRing), or
  // where JavaScript never closes the lane, when V8 collects the ArrayBuffer (its finalizer).
  // Neither waits for V8 otherwise, so V8 need not count the ring: counted, the rings of 1024
  // TCP comm pairs connected and closed twice made V8 run 37-50 full collections, against 8-9
  // (docs/performance.md, item 45). Made before the lane, so that a failure has only the ring
  // to undo; until the lane holds the ring, the view holds nothing (dropped).
  napi_value ab = nullptr;
  napi_ref ref = nullptr;
  RxView* v = nullptr;
  if (rxBytes) {
    v = new RxView();
    v->dropped = true;
    bool tied = false;
    if (!(ab = ringView(env, mem, memBytes)) ||
        !(tied = napi_add_finalizer(env, ab, v, [](napi_env, void* data, void*) {
            RxView* view = static_cast<RxView*>(data);
            if (!view->dropped) rxRelease(view->mem);
            delete view;
          }, nullptr, nullptr) == napi_ok) ||
        napi_create_reference(env, ab, 0, &ref) != napi_ok) {
      if (ab) napi_detach_arraybuffer(env, ab);
      if (!tied) delete v;  // else the finalizer deletes it
      close(mine);
      pagesFree(mem, memBytes);
      return fail(env, "ioAdopt: the receive ring's ArrayBuffer could not be made");
    }
  }
  Lane* l = newLane(mine, E->threads[ti], p, static_cast<uint32_t>(linkD));
  if (!l) {
    close(mine);
    if (ab) {
      napi_detach_arraybuffer(env, ab);
      napi_delete_reference(env, ref);
    }
    pagesFree(mem, memBytes);
    return fail(env, "ioAdopt: too many lanes");
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("lane", l->id);
  out.Set("thread", ti);
  if (rxBytes) {
    memset(mem, 0, sizeof(tsn_rx_hdr_t));
    l->rxHdr = static_cast<tsn_rx_hdr_t*>(mem);
    l->rxHdr->capacity = rxBytes;
    l->rx = static_cast<uint8_t*>(mem) + sizeof(tsn_rx_hdr_t);
    l->rxCap = rxBytes;
    RxMem* rm = new RxMem();
    rm->mem = mem;
    rm->bytes = memBytes;
    l->rxMem = rm;
    v->mem = rm;
    v->dropped = false;
    l->rxView = v;
    l->rxRef = ref;
    out.Set("rx", Napi::Value(env, ab));
  }
  // A control lane's bytes are messages for this thread: they wake it with the I/O thread. Before
  // the I/O thread has the fd, so that the number is still the lane's.
  if (rxBytes) watchLane(l, mine);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = l;
  if (epoll_ctl(l->t->ep, EPOLL_CTL_ADD, mine, &ev) < 0) {
    int err = errno;
    dropRing(env, l);
    unwatchLane(l);
    bool partial, hard;
    cancelLane(l, false, &partial, &hard);
    postAdmin(l->t, new Admin{nullptr, Admin::kRetire, l});
    return sysFail(env, "ioAdopt: epoll_ctl", err);
  }
  return out;
}

// ioWake(thread): wakes an I/O thread that said it sleeps (JavaScript checks `sleeping` first).
Napi::Value IoWake(const Napi::CallbackInfo& info) {
  double t;
  if (E && number(info, 0, &t) && t >= 0 && t < E->threads.size()) wakeThread(E->threads[static_cast<int>(t)]);
  return info.Env().Undefined();
}

// ioSetDirectIdle(us): ioWriteNow leaves a frame to the I/O thread when its lane wrote less than
// us ago (a stream, whose frames that thread gathers); 0: no such rule. Process-wide.
Napi::Value IoSetDirectIdle(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double us;
  if (!E) return fail(env, "ioSetDirectIdle: call ioStart first");
  if (!number(info, 0, &us) || !(us >= 0 && us <= 1e6)) return fail(env, "ioSetDirectIdle(us) needs 0 .. 1e6");
  E->directIdleNs.store(static_cast<uint64_t>(us * 1000), std::memory_order_relaxed);
  return env.Undefined();
}

// ioWriteNow(thread, index) -> -1 | -2 | time: the calling protocol thread writes the
// submission it put at `index` of its ring to I/O thread `thread`, not yet published, itself
// (writeNow, engine.cc). The caller has seen that ring empty: the I/O thread took everything
// published before. -1: nothing written, publish the record as it is; -2: part written, the
// record now names the rest, publish it (its completion comes from the I/O thread); else all
// of it went, and this is the completion's time (µs as in the completion ring; 0 without
// ioTrace). Throws only for arguments that are not a thread and a number.
Napi::Value IoWriteNow(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double td, idx;
  if (!E) return fail(env, "ioWriteNow: call ioStart first");
  if (!number(info, 0, &td) || !number(info, 1, &idx)) return fail(env, "ioWriteNow(thread, index) needs two numbers");
  if (!(td >= 0 && td < E->threads.size())) return fail(env, "ioWriteNow: no such I/O thread", true);
  int p = bindingThreadIndex();
  Port* port = p >= 0 && p < kMaxPorts ? E->ports[p].load(std::memory_order_acquire) : nullptr;
  if (!port) return fail(env, "ioWriteNow: call ioPort first");
  int t = static_cast<int>(td);
  tsn_sub_t* s = port->sub[t].at(static_cast<uint32_t>(idx));
  // A lane this thread closed may be freed by now: never looked up here (the ring's path
  // refuses it as before).
  if (closedHere().count(s->lane)) return Napi::Number::New(env, -1);
  switch (writeNow(p, E->threads[t], s)) {
    case WriteNow::kNone: return Napi::Number::New(env, -1);
    case WriteNow::kPart: return Napi::Number::New(env, -2);
    case WriteNow::kAll: break;
  }
  return Napi::Number::New(env, E->trace.load(std::memory_order_relaxed) ? static_cast<double>(nowNs()) / 1000.0 : 0);
}

// ioSetEarlyWake(on): lanes made from now on wake their protocol thread with their I/O thread
// (TSNET_EARLY_WAKE).
Napi::Value IoSetEarlyWake(const Napi::CallbackInfo& info) {
  if (E) E->earlyWake.store(info.Length() > 0 && info[0].ToBoolean().Value());
  return info.Env().Undefined();
}

// ioClose(lane, graceful) -> { partial, hard }. When it returns, no I/O thread touches memory
// named in the lane's submissions again and no completion of the lane is made (one made just
// before may still be published after: the caller drops the link's completions). graceful: the
// protocol-owned (inline) bytes already submitted still go out, then the I/O thread shuts
// down writing and waits (bounded) for the peer's end; impossible when a write of external
// memory was half sent (partial): then, as without graceful, the socket is closed at once.
// Closes a lane of the calling protocol thread (ioClose, and every lane of a thread that
// stopped); returns whether the close is hard.
bool closeLane(Lane* l, bool graceful, bool* partial) {
  IoThread* t = l->t;
  unwatchLane(l);
  closedHere().insert(l->id);
  bool stuck = false;
  if (!syncSubs(l->port, t, &stuck))
    log(kLogWarn, "io: I/O thread %d did not take lane %u's submissions %s", t->index, l->id,
        stuck ? "(it is stuck inside a provider call)" : "within 10 s");
  bool hard = true;
  cancelLane(l, graceful, partial, &hard);
  // Not graceful: the lane lives until this kRetire. Graceful: the I/O thread may end the close
  // (and retire the lane) before it takes this kKick, but keeps the lane until it has (kicks).
  postAdmin(t, new Admin{nullptr, hard ? Admin::kRetire : Admin::kKick, l});
  return hard;
}

Napi::Value IoClose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownLane(info, "ioClose");
  if (!l) return env.Undefined();
  bool graceful = info.Length() > 1 && info[1].ToBoolean().Value();
  bool partial = false;
  dropRing(env, l);
  bool hard = closeLane(l, graceful, &partial);
  Napi::Object out = Napi::Object::New(env);
  out.Set("partial", partial);
  out.Set("hard", hard);
  return out;
}

// ioCancel(lane, base, len) -> { reads, writes }: reads into [base, base+len) drop the rest of
// their bytes (the stream stays whole; their completions still come); writes from that memory
// are only counted: they cannot be taken back without breaking the stream.
Napi::Value IoCancel(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownLane(info, "ioCancel");
  double base, len;
  if (!l) return env.Undefined();
  if (!number(info, 1, &base) || !number(info, 2, &len)) return fail(env, "ioCancel(lane, base, len) needs numbers");
  // As ioClose: submissions the I/O thread has not taken are not found by the cancel.
  bool stuck = false;
  if (!syncSubs(l->port, l->t, &stuck))
    log(kLogWarn, "io: I/O thread %d did not take lane %u's submissions %s; a cancel misses those", l->t->index, l->id,
        stuck ? "(it is stuck inside a provider call)" : "within 10 s");
  int reads = 0, writes = 0;
  cancelRange(l, static_cast<size_t>(base), static_cast<size_t>(len), &reads, &writes);
  Napi::Object out = Napi::Object::New(env);
  out.Set("reads", reads);
  out.Set("writes", writes);
  return out;
}

// ioTrace(on): completions carry their time (for TSNET_TRACE).
Napi::Value IoTrace(const Napi::CallbackInfo& info) {
  if (E) E->trace.store(info.Length() > 0 && info[0].ToBoolean().Value());
  return info.Env().Undefined();
}

// The count an eventfd holds (wake-ups written and not yet read), from /proc without reading
// it; -1 where /proc cannot tell.
double eventfdCount(int fd) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
  int f = open(path, O_RDONLY | O_CLOEXEC);
  if (f < 0) return -1;
  ssize_t n = read(f, buf, sizeof buf - 1);
  close(f);
  if (n <= 0) return -1;
  buf[n] = 0;
  const char* c = strstr(buf, "eventfd-count:");
  return c ? static_cast<double>(strtoull(c + 14, nullptr, 16)) : -1;  // the kernel prints it in hex
}

// ioLaneState(lane) -> what the engine knows of one of this thread's lanes, for a WARN when a
// link goes quiet (the dead-peer check): its I/O thread (its sleeping flag, wake-ups written to
// its eventfd and not yet read, passes so far, whether it is inside a provider call), the
// protocol thread's wake-up state, the submissions published to that I/O thread and not yet
// taken, the completions it published and this thread has not taken, and under the lane's
// lock (given up after 50 ms: `locked` false) its flags, queued writes and reads with their
// bytes left, the receive ring and the socket's unread and unsent bytes. `listed` and `hup` belong to the I/O thread and are read
// without its cooperation: a hint, not a fact.
Napi::Value IoLaneState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownLane(info, "ioLaneState");
  if (!l) return env.Undefined();
  IoThread* t = l->t;
  Napi::Object o = Napi::Object::New(env);
  o.Set("lane", l->id);
  o.Set("thread", t->index);
  o.Set("sleepFlag", __atomic_load_n(&E->sleeping[t->index], __ATOMIC_SEQ_CST));
  o.Set("wakeCount", eventfdCount(t->ev));
  o.Set("passes", t->passes.load(std::memory_order_relaxed));
  o.Set("inCall", t->callLane.load(std::memory_order_acquire) != 0);
  Port* port = E->ports[l->port].load(std::memory_order_acquire);
  if (port) {
    const tsn_ring_hdr_t* s = port->sub[t->index].hdr;
    const tsn_ring_hdr_t* c = port->cq[t->index].hdr;
    o.Set("subsWaiting", loadSeqCst(&s->tail) - loadSeqCst(&s->head));
    o.Set("cqesWaiting", loadSeqCst(&c->tail) - loadSeqCst(&c->head));
  }
  bool spinning, pending, readable;
  if (pluginWakeState(l->port, &spinning, &pending, &readable)) {
    o.Set("ptSpinning", spinning);
    o.Set("ptWakePending", pending);
    o.Set("ptWakeReadable", readable);
  }
  o.Set("listed", __atomic_load_n(&l->listed, __ATOMIC_RELAXED));
  o.Set("hup", __atomic_load_n(&l->hup, __ATOMIC_RELAXED));
  std::unique_lock<std::mutex> g(l->mu, std::defer_lock);
  for (int k = 0; k < 50 && !g.try_lock(); k++) usleep(1000);
  o.Set("locked", g.owns_lock());
  if (!g.owns_lock()) return o;
  o.Set("closed", l->closed);
  o.Set("closing", l->closing);
  if (l->ofi) {  // a libfabric lane: its doorbell, where it has one
    o.Set("bell", l->ofi->bellFd() >= 0);
    o.Set("bellRang", static_cast<double>(l->ofi->bellRang()));
    o.Set("bellHeard", static_cast<double>(l->ofi->bellHeard()));
    o.Set("outgoing", static_cast<double>(l->ofi->outgoing()));
  }
  o.Set("err", l->err);
  o.Set("eof", l->eof);
  for (int dir : {kW, kR}) {
    uint32_t n = 0;
    double left = 0;
    for (const Op* op = l->head[dir]; op; op = op->next) n++, left += static_cast<double>(op->left);
    o.Set(dir == kW ? "writes" : "reads", n);
    o.Set(dir == kW ? "writeBytes" : "readBytes", left);
  }
  if (l->rxHdr) {
    o.Set("rxWritten", loadSeqCst(&l->rxHdr->written));
    o.Set("rxConsumed", loadSeqCst(&l->rxHdr->consumed));
    o.Set("rxCapacity", l->rxCap);
    o.Set("rxStalled", l->rxStalled);
  }
  int in = -1, out = -1, unsent = -1;
  if (l->fd >= 0 && !l->ofi) {
    if (ioctl(l->fd, SIOCINQ, &in) < 0) in = -1;
    if (ioctl(l->fd, SIOCOUTQ, &out) < 0) out = -1;
    if (ioctl(l->fd, SIOCOUTQNSD, &unsent) < 0) unsent = -1;
  }
  o.Set("sockIn", in);
  o.Set("sockOut", out);
  o.Set("sockUnsent", unsent);
  return o;
}

// dumpStacks(pathTemplate) -> { threads, answered, file }: every thread's stack of the process
// into the file (native/stacks.h; "%p": the pid). Throws with the reason when the file cannot be
// written. Only with TSNET_STALL_STACKS set do tsnet's own threads answer.
Napi::Value DumpStacks(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) return fail(env, "dumpStacks(pathTemplate) needs a file name");
  StackDump d = dumpStacks(info[0].As<Napi::String>().Utf8Value());
  if (!d.error.empty()) return fail(env, "dumpStacks: " + d.error);
  Napi::Object o = Napi::Object::New(env);
  o.Set("threads", d.threads);
  o.Set("answered", d.answered);
  o.Set("file", d.file);
  return o;
}

// ioStalls(thresholdMs) -> [{ thread, lane, ms, call }]: I/O threads that have been inside one
// provider call (libfabric, or CUDA's context call) for thresholdMs or more without finishing a
// pass, each reported once per call, to whichever protocol thread asks first. Such a call may
// never return: nothing outside it can end it (docs/ofi-facts.md). The threads are sampled: a
// stall counts from the first call of this function that found it.
Napi::Value IoStalls(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double threshold;
  if (!number(info, 0, &threshold) || threshold < 0) return fail(env, "ioStalls(thresholdMs) needs a number >= 0");
  Napi::Array out = Napi::Array::New(env);
  if (!E) return out;
  static const char* const kCalls[] = {"", "a post", "a completion queue poll", "making the GPU's CUDA context current", "a test stall"};
  uint64_t now = nowNs();
  std::lock_guard<std::mutex> g(E->stallMu);
  uint32_t k = 0;
  for (IoThread* t : E->threads) {
    uint32_t lane = t->callLane.load(std::memory_order_acquire);
    uint32_t passes = t->passes.load(std::memory_order_relaxed);
    if (lane == 0 || passes != t->seenPasses || t->seenSinceNs == 0) {
      t->seenPasses = passes;
      t->seenSinceNs = lane == 0 ? 0 : now;
      t->stallReported = false;
      continue;
    }
    double ms = static_cast<double>(now - t->seenSinceNs) / 1e6;
    if (t->stallReported || ms < threshold) continue;
    t->stallReported = true;
    t->stuckPass.store(static_cast<uint64_t>(passes) + 1, std::memory_order_relaxed);  // waits on it give up at once
    uint32_t call = t->call.load(std::memory_order_relaxed);
    Napi::Object o = Napi::Object::New(env);
    o.Set("thread", t->index);
    o.Set("lane", lane == ~0u ? -1.0 : static_cast<double>(lane));
    o.Set("ms", ms);
    o.Set("call", call < sizeof kCalls / sizeof kCalls[0] ? kCalls[call] : "a provider call");
    out.Set(k++, o);
  }
  return out;
}

// ioStats() -> CPU microseconds each I/O thread has used.
Napi::Value IoStats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int n = E ? static_cast<int>(E->threads.size()) : 0;
  Napi::Float64Array out = Napi::Float64Array::New(env, n);
  for (int i = 0; i < n; i++) {
    clockid_t c;
    timespec ts{};
    if (pthread_getcpuclockid(E->threads[i]->handle, &c) == 0) clock_gettime(c, &ts);
    out[i] = static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
  }
  return out;
}

// ioSpinShared() -> per I/O thread, the passes it polled on in a busy-poll window that only
// another rail of its endpoints kept open, then (from index n) those only another endpoint's
// work kept open (engine.cc, windowClosed).
Napi::Value IoSpinShared(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int n = E ? static_cast<int>(E->threads.size()) : 0;
  Napi::Float64Array out = Napi::Float64Array::New(env, 2 * n);
  for (int i = 0; i < n; i++) {
    out[i] = static_cast<double>(E->threads[i]->sharedSpins.load(std::memory_order_relaxed));
    out[n + i] = static_cast<double>(E->threads[i]->borrowedSpins.load(std::memory_order_relaxed));
  }
  return out;
}

// ioSetSpin(us): every I/O thread's busy-poll window from now on (TSNET_SPIN_MAX_US adapts it).
Napi::Value IoSetSpin(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double us;
  if (!number(info, 0, &us) || us < 0 || us > 1e6) return fail(env, "ioSetSpin(us) needs a number from 0 to 1000000");
  if (E)
    for (IoThread* t : E->threads) t->spinNs.store(static_cast<uint64_t>(us * 1000), std::memory_order_relaxed);
  return env.Undefined();
}

// ioWakes() -> per I/O thread, how late it woke when asked to: { count, sumUs, maxUs, buckets }
// (bucket k: below 2^(k+1) us; the last, the rest).
Napi::Value IoWakes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int n = E ? static_cast<int>(E->threads.size()) : 0;
  Napi::Array out = Napi::Array::New(env, n);
  for (int i = 0; i < n; i++) out.Set(i, wakeDelaysObject(env, E->threads[i]->wakes));
  return out;
}

}  // namespace

// --- early wake-ups ---
//
// A message that finds both of a side's threads asleep used to wake them in turn: the I/O
// thread first (its socket or doorbell), which read it and then woke the protocol thread. Each
// protocol thread also watches, through an epoll set of its own in its event loop, the fds that
// announce messages for it: each TCP control lane's socket and each endpoint's doorbell (or wait
// fd). Both threads then wake at once, and the protocol thread's busy-poll window is open when
// the I/O thread hands the message over. The entries are one-shot: one wake-up per fd until the
// thread sleeps again (engineArmWatches), so a message in a burst costs nothing. The thread never
// reads these fds; everything that goes wrong here costs an early wake-up or a useless one,
// never a message.

void watchLane(Lane* l, int fd) {
  if (!E || fd < 0 || !E->earlyWake.load(std::memory_order_relaxed)) return;
  Port* port = E->ports[l->port].load(std::memory_order_acquire);
  if (!port) return;
  if (port->watchEp < 0) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return;
    if (!pluginWatchFd(ep)) {  // no event loop here, or no busy-poll window to open
      close(ep);
      return;
    }
    port->watchEp = ep;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u32 = l->id;
  if (epoll_ctl(port->watchEp, EPOLL_CTL_ADD, fd, &ev) == 0) port->watched.push_back({l->id, fd});
}

void unwatchLane(Lane* l) {
  Port* port = E ? E->ports[l->port].load(std::memory_order_acquire) : nullptr;
  if (!port || port->watched.empty()) return;
  auto it = std::find_if(port->watched.begin(), port->watched.end(), [&](const Port::Watch& w) { return w.lane == l->id; });
  if (it == port->watched.end()) return;
  int fd = it->fd;
  port->watched.erase(it);
  // Only while the lane's fd is still its own (the lock keeps the I/O thread from closing it);
  // once closed, the kernel dropped the entry with the file. A lane whose I/O thread holds the
  // lock (stuck in a provider) keeps its entry until its fd closes.
  std::unique_lock<std::mutex> g(l->mu, std::try_to_lock);
  if (g.owns_lock() && !l->closed) epoll_ctl(port->watchEp, EPOLL_CTL_DEL, fd, nullptr);
}

void engineArmWatches(int p) {
  Port* port = E && p >= 0 && p < kMaxPorts ? E->ports[p].load(std::memory_order_acquire) : nullptr;
  if (!port || port->watchEp < 0) return;
  for (const Port::Watch& w : port->watched) {
    Lane* l = laneOf(w.lane);  // freed only after this thread's ioClose, which unwatches it first
    if (!l) continue;
    std::unique_lock<std::mutex> g(l->mu, std::try_to_lock);
    if (!g.owns_lock() || l->closed || l->quiet) continue;  // busy or going: no early wake-up this time
    // Readable already: bytes the I/O thread has not read yet (it hands them over itself), or a
    // lane that stays readable (a full receive ring, the peer's end), which would wake this
    // thread at every sleep.
    pollfd pf{w.fd, POLLIN, 0};
    if (poll(&pf, 1, 0) != 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u32 = w.lane;
    epoll_ctl(port->watchEp, EPOLL_CTL_MOD, w.fd, &ev);
  }
}

void engineClosePort(int port) {
  if (!E) return;
  // Lanes are freed only after their own thread's ioClose (closedHere), so those found here,
  // not closed by this thread, stay valid while it closes them.
  std::vector<Lane*> mine;
  {
    std::lock_guard<std::mutex> g(E->laneMu);
    for (uint32_t id = 1; id < E->nextId; id++)
      if (Lane* l = laneOf(id); l && l->port == port && !closedHere().count(id)) mine.push_back(l);
  }
  bool partial = false;
  for (Lane* l : mine) closeLane(l, false, &partial);
  if (!mine.empty()) log(kLogInfo, "io: protocol thread %d has stopped: its %zu lane(s) are closed", port, mine.size());
}

bool enginePortHasWork(int port) {
  if (!E) return false;
  Port* p = E->ports[port].load(std::memory_order_acquire);
  if (!p) return false;
  for (size_t t = 0; t < E->threads.size(); t++)
    if (loadSeqCst(&p->cq[t].hdr->tail) != loadAcquire(&p->cq[t].hdr->head)) return true;
  return false;
}

// The plugin's clock for liveness and timeouts (plugin/clock.ts): whole milliseconds on
// CLOCK_MONOTONIC since the library was loaded, one origin for every protocol thread. Below 2^30
// (12 days) V8 keeps it as a small integer, so the plugin's reads allocate nothing. Here, with
// the engine, so that the tests' addon (standalone.cc) reads the same clock.
const uint64_t g_monoOrigin = nowNs();
Napi::Value MonoMs(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>((nowNs() - g_monoOrigin) / 1'000'000));
}

// Copies n bytes from s to d (not overlapping) with every store above the one before: 16-byte
// stores, aligned on the destination, and single bytes at the ends. x86 makes ordinary stores
// visible in program order, so a reader that sees a byte sees every byte below it. glibc's
// memcpy (what TypedArray.set comes to) keeps no such order: it stores a copy's head after its
// body, and above a few KiB (its rep_movsb_threshold) uses rep movsb, whose stores may become visible out of order. NCCL's
// LL and LL128 protocols take the flag at the end of each 8-byte word or 128-byte line as the
// sign that the bytes before it are there; where tsnet copies an eager message into NCCL's host
// buffer, a flag seen before its data gave wrong results (docs/protocol.md, "Eager copies").
// Loop patterns must not become memcpy calls here.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) static void copyAscending(uint8_t* d, const uint8_t* s, size_t n) {
  while (n && (reinterpret_cast<uintptr_t>(d) & 15)) {
    *d++ = *s++;
    n--;
  }
  for (; n >= 16; n -= 16, d += 16, s += 16) _mm_store_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  while (n--) *d++ = *s++;
}

// copyAscending(dst, dstOffset, src, srcOffset, len): copyAscending between two Uint8Arrays
// (plugin/arrays.ts, copyBytes). Out of range: a RangeError, nothing copied.
static Napi::Value CopyAscending(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 5 || !info[0].IsTypedArray() || !info[2].IsTypedArray())
    return fail(env, "copyAscending(dst, dstOffset, src, srcOffset, len) needs two Uint8Arrays");
  Napi::Uint8Array dst = info[0].As<Napi::Uint8Array>();
  Napi::Uint8Array src = info[2].As<Napi::Uint8Array>();
  double dOff = info[1].As<Napi::Number>().DoubleValue();
  double sOff = info[3].As<Napi::Number>().DoubleValue();
  double len = info[4].As<Napi::Number>().DoubleValue();
  if (!(dOff >= 0 && sOff >= 0 && len >= 0 && dOff + len <= static_cast<double>(dst.ElementLength()) &&
        sOff + len <= static_cast<double>(src.ElementLength())))
    return fail(env, "copyAscending: range out of bounds", true);
  copyAscending(dst.Data() + static_cast<size_t>(dOff), src.Data() + static_cast<size_t>(sOff), static_cast<size_t>(len));
  return env.Undefined();
}

void engineRegister(napi_env env, napi_value exports) {
  Napi::Env e(env);
  Napi::Object o(env, exports);
  o.Set("monoMs", Napi::Function::New(e, MonoMs, "monoMs"));
  o.Set("copyAscending", Napi::Function::New(e, CopyAscending, "copyAscending"));
  o.Set("ioStart", Napi::Function::New(e, IoStart, "ioStart"));
  o.Set("fdNote", Napi::Function::New(e, FdNote, "fdNote"));
  o.Set("ioPort", Napi::Function::New(e, IoPort, "ioPort"));
  o.Set("ioAdopt", Napi::Function::New(e, IoAdopt, "ioAdopt"));
  o.Set("tcpDial", Napi::Function::New(e, TcpDial, "tcpDial"));
  o.Set("tcpDialed", Napi::Function::New(e, TcpDialed, "tcpDialed"));
  o.Set("fdSend", Napi::Function::New(e, FdSend, "fdSend"));
  o.Set("fdRecv", Napi::Function::New(e, FdRecv, "fdRecv"));
  o.Set("tcpListen", Napi::Function::New(e, TcpListen, "tcpListen"));
  o.Set("tcpAccept", Napi::Function::New(e, TcpAccept, "tcpAccept"));
  o.Set("fdWatchHandler", Napi::Function::New(e, FdWatchHandler, "fdWatchHandler"));
  o.Set("fdWatch", Napi::Function::New(e, FdWatch, "fdWatch"));
  o.Set("fdWatchWritable", Napi::Function::New(e, FdWatchWritable, "fdWatchWritable"));
  o.Set("fdUnwatch", Napi::Function::New(e, FdUnwatch, "fdUnwatch"));
  o.Set("ioWake", Napi::Function::New(e, IoWake, "ioWake"));
  o.Set("ioSetDirectIdle", Napi::Function::New(e, IoSetDirectIdle, "ioSetDirectIdle"));
  o.Set("ioWriteNow", Napi::Function::New(e, IoWriteNow, "ioWriteNow"));
  o.Set("ioClose", Napi::Function::New(e, IoClose, "ioClose"));
  o.Set("ioCancel", Napi::Function::New(e, IoCancel, "ioCancel"));
  o.Set("ioTrace", Napi::Function::New(e, IoTrace, "ioTrace"));
  o.Set("ioStats", Napi::Function::New(e, IoStats, "ioStats"));
  o.Set("ioSpinShared", Napi::Function::New(e, IoSpinShared, "ioSpinShared"));
  o.Set("ioWakes", Napi::Function::New(e, IoWakes, "ioWakes"));
  o.Set("ioSetSpin", Napi::Function::New(e, IoSetSpin, "ioSetSpin"));
  o.Set("ioSetEarlyWake", Napi::Function::New(e, IoSetEarlyWake, "ioSetEarlyWake"));
  o.Set("ioStalls", Napi::Function::New(e, IoStalls, "ioStalls"));
  o.Set("dumpStacks", Napi::Function::New(e, DumpStacks, "dumpStacks"));
  o.Set("ioLaneState", Napi::Function::New(e, IoLaneState, "ioLaneState"));
  ofiRegister(env, exports);
}

void engineSetRingView(RingViewMaker make) { g_ringView.store(make, std::memory_order_relaxed); }

}  // namespace tsn
