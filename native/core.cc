// The version-neutral core (tsn_*): what every generated per-version adapter calls.
// It validates NCCL's arguments, runs control calls on the plugin thread, and keeps the
// data path (isend/irecv/iflush/test) in native memory: a request slot, a queue post, and
// an acquire load in test. Errors are translated to ncclResult_t here and in the plugin's
// one table (plugin/errors.ts); every error carries a WARN naming the problem.
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../embed/host.h"
#include "binding.h"
#include "internal.h"
#include "warmup.h"

namespace tsn {

static std::atomic<tsn_logger_t> g_logger{nullptr};
static std::atomic<Ctx*> g_legacy{nullptr};  // the context of v6-v10, which have none

void setLogger(tsn_logger_t logger) { g_logger.store(logger, std::memory_order_release); }

void logMessage(int level, unsigned long flags, const char* msg) {
  tsn_logger_t l = g_logger.load(std::memory_order_acquire);
  if (l) l(level, flags, __FILE__, __LINE__, "NET/tsnet %s", msg);
  else if (level == kLogWarn) fprintf(stderr, "NET/tsnet WARN %s\n", msg);  // never stdout
}

void log(int level, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  logMessage(level, level == kLogWarn ? ~0UL : (kSubsysInit | kSubsysNet), buf);
}

#define FAIL(rc, ...) \
  do { log(kLogWarn, __VA_ARGS__); return (rc); } while (0)

template <typename T>
static T* handleOf(void* p, uint32_t magic) {
  T* t = static_cast<T*>(p);
  return (t && t->magic == magic) ? t : nullptr;
}

static Ctx* ctxOf(void* ctx) {
  if (!ctx) return g_legacy.load(std::memory_order_acquire);
  return handleOf<Ctx>(ctx, kMagicCtx);
}

// The comms and listeners not yet closed, so that finalize can retire those of its context.
static std::mutex& liveMu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
static std::set<Comm*>& liveComms() {
  static std::set<Comm*>* s = new std::set<Comm*>();
  return *s;
}
static std::set<ListenComm*>& liveListens() {
  static std::set<ListenComm*>* s = new std::set<ListenComm*>();
  return *s;
}

// The memory of handles of one kind that left their quarantine: a new handle of that kind
// takes it (make), and it never goes back to the allocator. A handle NCCL kept past the
// quarantine so still points at a T, whose magic says dead or names the newer handle, never
// at freed memory (under AddressSanitizer, the driver's stale scenario read freed memory
// before).
template <typename T>
struct Recycled {
  std::mutex mu;
  std::vector<T*> free;
};
template <typename T>
static Recycled<T>& recycled() {
  static Recycled<T>* r = new Recycled<T>();
  return *r;
}

// Memory of a handle never given out (its call failed): back to the others at once. Its memory
// may be a recycled handle's that NCCL still holds, so it is never deleted either.
template <typename T>
static void recycle(T* p) {
  p->magic = kMagicDead;
  Recycled<T>& r = recycled<T>();
  std::lock_guard<std::mutex> g(r.mu);
  r.free.push_back(p);
}

// A new handle, value-initialised from args, in recycled memory where some is free.
template <typename T, typename... Args>
static T* make(Args&&... args) {
  Recycled<T>& r = recycled<T>();
  T* p = nullptr;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.free.empty()) {
      p = r.free.back();
      r.free.pop_back();
    }
  }
  if (!p) return new T{std::forward<Args>(args)...};
  p->~T();
  return new (p) T{std::forward<Args>(args)...};
}

// Runs on the comm's protocol thread (inside hostCall): the plugin learns where the comm's
// slot states live. A failure leaves no comm behind.
static Comm* newComm(uint32_t magic, uint32_t jsId, int thread, Ctx* ctx) {
  Comm* c = make<Comm>();
  c->magic = magic;
  c->jsId = jsId;
  c->thread = thread;
  c->ctx = ctx;
  for (int i = 0; i < kSlotsPerComm; i++) {
    c->slots[i].magic = kMagicRequest;
    c->slots[i].comm = c;
    c->slots[i].index = static_cast<uint16_t>(i);
    c->slots[i].group = -1;
    c->slots[i].bufs = &c->slots[i].one;
  }
  c->groupsFree = kGroups == 32 ? ~0u : (1u << kGroups) - 1;
  if (jsAttachComm(c) != TSN_SUCCESS) {
    jsCloseComm(c);
    recycle(c);
    return nullptr;
  }
  std::lock_guard<std::mutex> g(liveMu());
  liveComms().insert(c);
  return c;
}

// A handle NCCL gave back (a closed comm, a finalized context, a deregistered region, a closed
// listener) keeps its memory for a while, its magic dead: a stale call (a request of it tested
// after an abort, a second close) gets an error, and no later handle takes its address and is
// acted on in its place. The oldest is recycled (make) after kQuarantine more of its kind, so
// repeated cycles hold bounded memory.
template <typename T, size_t kQuarantine>
static void quarantine(T* p) {
  static std::mutex* mu = new std::mutex();
  static std::deque<T*>* dead = new std::deque<T*>();
  p->magic = kMagicDead;
  T* old = nullptr;
  {
    std::lock_guard<std::mutex> g(*mu);
    dead->push_back(p);
    if (dead->size() > kQuarantine) {
      old = dead->front();
      dead->pop_front();
    }
  }
  if (old) recycle(old);
}

static void retireComm(Comm* c) {
  {
    std::lock_guard<std::mutex> g(liveMu());
    liveComms().erase(c);
  }
  for (Request& r : c->slots) r.magic = kMagicDead;
  quarantine<Comm, 64>(c);  // its slots: the largest handle
}

static void retireListen(ListenComm* l) {
  {
    std::lock_guard<std::mutex> g(liveMu());
    liveListens().erase(l);
  }
  quarantine<ListenComm, 1024>(l);
}

// The protocol thread for a new listener: round robin over the running ones.
static int pickThread() {
  static std::atomic<unsigned> next{0};
  return static_cast<int>(next++ % static_cast<unsigned>(hostThreads()));
}

// NCCL calls connect again with the same handle until the comm is up: every retry must reach
// the protocol thread that holds the attempt.
static std::mutex g_connectMu;
static std::map<std::string, int>* g_connecting = new std::map<std::string, int>();

static std::string connectKey(Ctx* c, int dev, const void* handle) {
  std::string k(reinterpret_cast<const char*>(&c), sizeof c);
  k.append(reinterpret_cast<const char*>(&dev), sizeof dev);
  k.append(static_cast<const char*>(handle), TSN_HANDLE_SIZE);
  return k;
}

// A free slot of the comm, or nullptr when all are in flight. One thread drives a comm's
// data path, so the search needs no lock; the state itself is shared with the protocol thread.
static Request* takeSlot(Comm* c) {
  for (int k = 0; k < kSlotsPerComm; k++) {
    Request* r = &c->slots[(c->cursor + k) % kSlotsPerComm];
    if (slotState(c, r->index) == kFree) {
      c->cursor = (r->index + 1) % kSlotsPerComm;
      return r;
    }
  }
  return nullptr;
}

// A free group of buffers of the comm (its index), or -1 when every one is in flight.
static int takeGroup(Comm* c) {
  uint32_t free = __atomic_load_n(&c->groupsFree, __ATOMIC_ACQUIRE);
  while (free) {
    int g = __builtin_ctz(free);
    if (__atomic_compare_exchange_n(&c->groupsFree, &free, free & ~(1u << g), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return g;
  }
  return -1;
}

static void freeGroup(Comm* c, int g) { __atomic_fetch_or(&c->groupsFree, 1u << g, __ATOMIC_RELEASE); }

// A slot for an operation of n buffers, with them copied in (a group of the comm's when n > 1),
// or nullptr when every slot or every group is in flight (NCCL tries again later).
static Request* takeSlotFor(Comm* c, int n, const Buf* bufs) {
  int g = n > 1 ? takeGroup(c) : -1;
  if (n > 1 && g < 0) return nullptr;
  Request* r = takeSlot(c);
  if (!r) {
    if (g >= 0) freeGroup(c, g);
    return nullptr;
  }
  r->group = g;
  r->bufs = g >= 0 ? c->groups[g] : &r->one;
  memcpy(r->bufs, bufs, sizeof(Buf) * n);
  r->n = n;
  return r;
}

// Hands a filled slot to the comm's protocol thread.
static void post(Comm* c, Request* r) {
  r->postedUs = tracing() ? traceNowUs() : 0;
  r->warmup = warmingUp();
  __atomic_store_n(&c->status[r->index].state, kPosted, __ATOMIC_RELAXED);  // published by hostPost
  hostPost(c->thread, r);
}

// Resolves [data, data+size) inside a registered region of this comm.
static tsn_result_t resolve(Comm* c, const char* what, void* data, size_t size, void* mhandle, int tag, Buf* b) {
  b->size = size;
  b->tag = tag;
  b->mrId = 0;
  b->offset = 0;
  if (size > static_cast<size_t>(INT_MAX))
    FAIL(TSN_INVALID_ARGUMENT, "%s: size %zu is larger than the plugin's maximum %d", what, size, INT_MAX);
  if (size == 0 && !mhandle) return TSN_SUCCESS;
  Mr* mr = handleOf<Mr>(mhandle, kMagicMr);
  if (!mr) FAIL(TSN_INVALID_ARGUMENT, "%s: %p is not a memory handle from regMr", what, mhandle);
  if (mr->comm != c) FAIL(TSN_INVALID_ARGUMENT, "%s: memory handle %p was registered on another comm", what, mhandle);
  char* p = static_cast<char*>(data);
  if (p < mr->base || p > mr->base + mr->size || size > static_cast<size_t>(mr->base + mr->size - p))
    FAIL(TSN_INVALID_ARGUMENT, "%s: buffer %p+%zu is outside its registered region %p+%zu", what, data, size,
         static_cast<void*>(mr->base), mr->size);
  b->mrId = mr->jsId;
  b->offset = static_cast<uint64_t>(p - mr->base);
  return TSN_SUCCESS;
}

}  // namespace tsn

using namespace tsn;

extern "C" {

tsn_result_t tsn_init(void** ctx, uint64_t commId, const tsn_comm_config_t* config, tsn_logger_t logger,
                      tsn_profiler_t prof) {
  (void)prof;  // no profiler events yet
  if (logger) setLogger(logger);
  tsn_result_t rc = hostStart();
  if (rc != TSN_SUCCESS) return rc;
  // v6-v10 pass TSN_NO_CTX (they have no context); v11+ pass where the context goes, never NULL.
  bool legacy = ctx == reinterpret_cast<void**>(TSN_NO_CTX);
  if (!ctx) FAIL(TSN_INVALID_ARGUMENT, "init: ctx is NULL: ncclNet v11+ init returns the communicator's context through it");
  if (legacy && g_legacy.load()) return TSN_SUCCESS;  // NCCL loaded the library again
  uint32_t id = 0;
  int warmup = 0;  // non-zero only in the answer to the process's first init
  int trafficClass = config ? config->trafficClass : -1;
  rc = hostCall(0, [&] { return jsInit(commId, trafficClass, legacy, &id, &warmup); }, "init");
  if (rc != TSN_SUCCESS) return rc;
  Ctx* c = make<Ctx>(kMagicCtx, id);
  if (legacy) {
    Ctx* expected = nullptr;
    if (!g_legacy.compare_exchange_strong(expected, c)) recycle(c);
  } else {
    *ctx = c;
  }
  if (warmup > 0) warmUp(legacy ? nullptr : c, warmup);
  return TSN_SUCCESS;
}

tsn_result_t tsn_devices(int* ndev) {
  if (!ndev) FAIL(TSN_INVALID_ARGUMENT, "devices: ndev is NULL");
  return hostCall(0, [&] { return jsDevices(ndev); }, "devices");
}

tsn_result_t tsn_get_properties(int dev, tsn_props_t* props) {
  if (!props) FAIL(TSN_INVALID_ARGUMENT, "getProperties: props is NULL");
  return hostCall(0, [&] { return jsGetProperties(dev, props); }, "getProperties");
}

tsn_result_t tsn_listen(void* ctx, int dev, void* handle, void** listenComm) {
  Ctx* c = ctxOf(ctx);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "listen: %p is not a context from init", ctx);
  if (!handle || !listenComm) FAIL(TSN_INVALID_ARGUMENT, "listen: handle or listenComm is NULL");
  int thread = pickThread();
  return hostCall(thread, [&] {
    uint32_t id = 0;
    tsn_result_t rc = jsListen(c->jsId, dev, handle, &id);
    if (rc == TSN_SUCCESS) {
      auto* l = make<ListenComm>(kMagicListen, id, thread, c);
      std::lock_guard<std::mutex> g(liveMu());
      liveListens().insert(l);
      *listenComm = l;
    }
    return rc;
  }, "listen");
}

tsn_result_t tsn_connect(void* ctx, int dev, const tsn_comm_config_t* config, void* handle, void** sendComm,
                         tsn_dev_handle_t** sendDevComm) {
  (void)sendDevComm;  // a host plugin has no device comm; RCCL may pass a fake pointer
  Ctx* c = ctxOf(ctx);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "connect: %p is not a context from init", ctx);
  if (!handle || !sendComm) FAIL(TSN_INVALID_ARGUMENT, "connect: handle or sendComm is NULL");
  *sendComm = nullptr;
  if (hostDown(-1, "connect")) return TSN_INTERNAL_ERROR;  // before g_connectMu, which a lost thread may hold
  int trafficClass = config ? config->trafficClass : -1;
  std::string key = connectKey(c, dev, handle);
  int thread;
  {
    std::lock_guard<std::mutex> g(g_connectMu);
    auto it = g_connecting->find(key);
    thread = it != g_connecting->end() ? it->second : ((*g_connecting)[key] = pickThread());
  }
  tsn_result_t rc = hostCall(thread, [&] {
    uint32_t id = 0;
    tsn_result_t r = jsConnect(c->jsId, dev, trafficClass, handle, &id);
    if (r == TSN_SUCCESS && id && !(*sendComm = newComm(kMagicSend, id, thread, c))) r = TSN_INTERNAL_ERROR;
    return r;
  }, "connect");
  if (rc != TSN_SUCCESS || *sendComm) {
    std::lock_guard<std::mutex> g(g_connectMu);
    g_connecting->erase(key);
  }
  return rc;
}

tsn_result_t tsn_accept(void* listenComm, void** recvComm, tsn_dev_handle_t** recvDevComm) {
  (void)recvDevComm;
  ListenComm* l = handleOf<ListenComm>(listenComm, kMagicListen);
  if (!l) FAIL(TSN_INVALID_ARGUMENT, "accept: %p is not a listen comm", listenComm);
  if (!recvComm) FAIL(TSN_INVALID_ARGUMENT, "accept: recvComm is NULL");
  *recvComm = nullptr;
  return hostCall(l->thread, [&] {
    uint32_t id = 0;
    tsn_result_t rc = jsAccept(l->jsId, &id);
    if (rc == TSN_SUCCESS && id && !(*recvComm = newComm(kMagicRecv, id, l->thread, l->ctx))) rc = TSN_INTERNAL_ERROR;
    return rc;
  }, "accept");
}

static Comm* anyComm(void* comm) {
  Comm* c = static_cast<Comm*>(comm);
  return (c && (c->magic == kMagicSend || c->magic == kMagicRecv)) ? c : nullptr;
}

// regMr, and regMrDmaBuf with fd >= 0.
static tsn_result_t regMr(const char* what, void* comm, void* data, size_t size, int type, int fd, uint64_t offset,
                          void** mhandle) {
  Comm* c = anyComm(comm);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "%s: %p is not a send or receive comm", what, comm);
  if (!mhandle) FAIL(TSN_INVALID_ARGUMENT, "%s: mhandle is NULL", what);
  if (!data) FAIL(TSN_INVALID_ARGUMENT, "%s: data is NULL (size %zu)", what, size);
  // Host memory gets a JavaScript view, which Node caps at 4 GiB (a v6/v7 int size of -1
  // arrives here as SIZE_MAX).
  constexpr size_t kMaxHostView = size_t(1) << 32;
  if (type == TSN_PTR_HOST && size > kMaxHostView)
    FAIL(TSN_INVALID_ARGUMENT, "%s: %zu bytes of host memory: tsnet registers at most 4 GiB of host memory in one region", what, size);
  Mr* mr = make<Mr>(kMagicMr, 0u, static_cast<char*>(data), size, c, nullptr);
  tsn_result_t rc = hostCall(c->thread, [&] { return jsRegMr(c, data, size, type, mr, fd, offset); }, what);
  if (rc != TSN_SUCCESS) {
    recycle(mr);
    return rc;
  }
  *mhandle = mr;
  return TSN_SUCCESS;
}

tsn_result_t tsn_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return regMr("regMr", comm, data, size, type, -1, 0, mhandle);
}

// NCCL passes a DMA-BUF fd only where getProperties offered NCCL_PTR_DMABUF, and closes it when
// this returns: the transport registers through it during the call.
tsn_result_t tsn_reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  if (fd < 0) FAIL(TSN_INVALID_ARGUMENT, "regMrDmaBuf: fd %d is not a file descriptor", fd);
  if (offset > reinterpret_cast<uintptr_t>(data))
    FAIL(TSN_INVALID_ARGUMENT, "regMrDmaBuf: offset %llu is larger than the address %p: the DMA-BUF would start below 0",
         static_cast<unsigned long long>(offset), data);
  return regMr("regMrDmaBuf", comm, data, size, type, fd, offset, mhandle);
}

tsn_result_t tsn_dereg_mr(void* comm, void* mhandle) {
  Comm* c = anyComm(comm);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "deregMr: %p is not a send or receive comm", comm);
  Mr* mr = handleOf<Mr>(mhandle, kMagicMr);
  if (!mr) FAIL(TSN_INVALID_ARGUMENT, "deregMr: %p is not a memory handle from regMr", mhandle);
  if (mr->comm != c) FAIL(TSN_INVALID_ARGUMENT, "deregMr: memory handle %p belongs to another comm", mhandle);
  tsn_result_t rc = hostCall(c->thread, [&] { return jsDeregMr(c, mr); }, "deregMr");
  quarantine<Mr, 4096>(mr);  // 48 bytes each
  return rc;
}

tsn_result_t tsn_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                       void** request) {
  (void)phandle;
  Comm* c = handleOf<Comm>(sendComm, kMagicSend);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "isend: %p is not a send comm", sendComm);
  if (!request) FAIL(TSN_INVALID_ARGUMENT, "isend: request is NULL");
  Buf b;
  tsn_result_t rc = resolve(c, "isend", data, size, mhandle, tag, &b);
  if (rc != TSN_SUCCESS) return rc;
  if (hostDown(c->thread, "isend")) return TSN_INTERNAL_ERROR;  // no protocol thread would take the request
  Request* r = takeSlotFor(c, 1, &b);
  *request = r;
  if (!r) return TSN_SUCCESS;  // all slots in flight: NCCL tries again later
  r->op = kOpSend;
  post(c, r);
  return TSN_SUCCESS;
}

tsn_result_t tsn_irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request) {
  (void)phandles;
  if (request) *request = nullptr;  // NCCL may have stored 0x1 there
  Comm* c = handleOf<Comm>(recvComm, kMagicRecv);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "irecv: %p is not a receive comm", recvComm);
  if (!request) FAIL(TSN_INVALID_ARGUMENT, "irecv: request is NULL");
  if (n < 1 || n > TSN_MAX_RECVS) FAIL(TSN_INVALID_ARGUMENT, "irecv: n = %d, expected 1 to %d", n, TSN_MAX_RECVS);
  if (!data || !sizes || !tags || !mhandles) FAIL(TSN_INVALID_ARGUMENT, "irecv: data, sizes, tags or mhandles is NULL");
  Buf bufs[TSN_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    tsn_result_t rc = resolve(c, "irecv", data[i], sizes[i], mhandles[i], tags[i], &bufs[i]);
    if (rc != TSN_SUCCESS) return rc;
  }
  if (hostDown(c->thread, "irecv")) return TSN_INTERNAL_ERROR;  // no protocol thread would take the request
  Request* r = takeSlotFor(c, n, bufs);
  *request = r;
  if (!r) return TSN_SUCCESS;
  r->op = kOpRecv;
  post(c, r);
  return TSN_SUCCESS;
}

tsn_result_t tsn_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  if (request) *request = nullptr;
  Comm* c = handleOf<Comm>(recvComm, kMagicRecv);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "iflush: %p is not a receive comm", recvComm);
  if (!request) FAIL(TSN_INVALID_ARGUMENT, "iflush: request is NULL");
  if (n < 1 || n > TSN_MAX_RECVS) FAIL(TSN_INVALID_ARGUMENT, "iflush: n = %d, expected 1 to %d", n, TSN_MAX_RECVS);
  if (!data || !sizes || !mhandles) FAIL(TSN_INVALID_ARGUMENT, "iflush: data, sizes or mhandles is NULL");
  Buf bufs[TSN_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) FAIL(TSN_INVALID_ARGUMENT, "iflush: sizes[%d] = %d", i, sizes[i]);
    tsn_result_t rc = resolve(c, "iflush", data[i], static_cast<size_t>(sizes[i]), mhandles[i], 0, &bufs[i]);
    if (rc != TSN_SUCCESS) return rc;
  }
  if (hostDown(c->thread, "iflush")) return TSN_INTERNAL_ERROR;  // no protocol thread would take the request
  Request* r = takeSlotFor(c, n, bufs);
  // A NULL flush request tells NCCL there was nothing to flush: never hand one out for want of room.
  if (!r)
    FAIL(TSN_INVALID_USAGE, "iflush: every request slot or group of buffers of receive comm %p is in flight (NCCL keeps at most %d requests in flight per comm)",
         recvComm, TSN_MAX_REQUESTS);
  *request = r;
  r->op = kOpFlush;
  post(c, r);
  return TSN_SUCCESS;
}

tsn_result_t tsn_test(void* request, int* done, int* sizes) {
  Request* r = handleOf<Request>(request, kMagicRequest);
  if (!r) FAIL(TSN_INVALID_ARGUMENT, "test: %p is not a request", request);
  if (!done) FAIL(TSN_INVALID_ARGUMENT, "test: done is NULL");
  tsn_slot_status_t* st = &r->comm->status[r->index];
  int s = slotState(r->comm, r->index);
  if (s == kPosted) {
    *done = 0;
    if (hostDown(r->comm->thread, "test")) return TSN_INTERNAL_ERROR;  // it would never complete
    return TSN_SUCCESS;
  }
  if (s == kFree) FAIL(TSN_INTERNAL_ERROR, "test: request %p is not in flight (tested after it completed?)", request);
  *done = 1;
  tsn_result_t rc = s == kDone ? TSN_SUCCESS : st->result;
  if (s == kDone && sizes && r->op != kOpFlush) memcpy(sizes, st->sizes, sizeof(int) * (r->op == kOpRecv ? r->n : 1));
  if (r->group >= 0) {  // the protocol thread copied the buffers when it took the request
    freeGroup(r->comm, r->group);
    r->group = -1;
  }
  __atomic_store_n(&st->state, kFree, __ATOMIC_RELEASE);
  return rc;
}

static tsn_result_t closeComm(void* comm, uint32_t magic, const char* what) {
  Comm* c = handleOf<Comm>(comm, magic);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "%s: %p is not a %s comm", what, comm, magic == kMagicSend ? "send" : "receive");
  // The plugin stops every operation that can still touch this comm's memory first.
  tsn_result_t rc = hostCall(c->thread, [&] { return jsCloseComm(c); }, what);
  retireComm(c);
  return rc;
}

tsn_result_t tsn_close_send(void* sendComm) { return closeComm(sendComm, kMagicSend, "closeSend"); }
tsn_result_t tsn_close_recv(void* recvComm) { return closeComm(recvComm, kMagicRecv, "closeRecv"); }

tsn_result_t tsn_close_listen(void* listenComm) {
  ListenComm* l = handleOf<ListenComm>(listenComm, kMagicListen);
  if (!l) FAIL(TSN_INVALID_ARGUMENT, "closeListen: %p is not a listen comm", listenComm);
  tsn_result_t rc = hostCall(l->thread, [&] { return jsCloseListen(l->jsId); }, "closeListen");
  retireListen(l);
  return rc;
}

tsn_result_t tsn_finalize(void* ctx) {
  // NCCL calls finalize with the context its init left, NULL when init failed (ncclNetPluginInit's
  // failure path, NCCL 2.28): there is nothing to finalize, and the init's WARN said why.
  if (!ctx) {
    log(kLogInfo, "finalize: no context (an init that failed leaves none); nothing to do");
    return TSN_SUCCESS;
  }
  Ctx* c = handleOf<Ctx>(ctx, kMagicCtx);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "finalize: %p is not a context from init", ctx);
  // Every protocol thread closes what it still runs for this context.
  tsn_result_t rc = TSN_SUCCESS;
  for (int t = 0; t < hostThreads(); t++) {
    tsn_result_t r = hostCall(t, [&] { return jsFinalize(c->jsId); }, "finalize");
    if (rc == TSN_SUCCESS) rc = r;
  }
  // The plugin closed the context's comms and listeners: their handles die too, so that a
  // later call on one (or a test() of its request) fails with a WARN instead of a request that
  // never completes.
  std::vector<Comm*> comms;
  std::vector<ListenComm*> listens;
  {
    std::lock_guard<std::mutex> g(liveMu());
    for (Comm* x : liveComms())
      if (x->ctx == c) comms.push_back(x);
    for (ListenComm* x : liveListens())
      if (x->ctx == c) listens.push_back(x);
  }
  if (!comms.empty() || !listens.empty())
    log(kLogInfo, "finalize: %zu comm(s) and %zu listener(s) of the context were still open; their handles are closed", comms.size(),
        listens.size());
  for (Comm* x : comms) retireComm(x);
  for (ListenComm* x : listens) retireListen(x);
  quarantine<Ctx, 1024>(c);
  return rc;
}

tsn_result_t tsn_set_net_attr(void* ctx, const tsn_net_attr_t* attr) {
  Ctx* c = ctxOf(ctx);
  if (!c) FAIL(TSN_INVALID_ARGUMENT, "setNetAttr: %p is not a context from init", ctx);
  if (!attr) FAIL(TSN_INVALID_ARGUMENT, "setNetAttr: attr is NULL");
  {
    std::lock_guard<std::mutex> g(c->attrMu);
    if (c->hasAttr && std::memcmp(&c->attr, attr, sizeof *attr) == 0) return TSN_SUCCESS;
  }
  tsn_result_t rc = hostCall(0, [&] { return jsSetNetAttr(c->jsId, attr); }, "setNetAttr");
  if (rc == TSN_SUCCESS) {
    std::lock_guard<std::mutex> g(c->attrMu);
    c->attr = *attr;
    c->hasAttr = true;
  }
  return rc;
}

}  // extern "C"
