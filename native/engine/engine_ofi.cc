// libfabric lanes of the engine: an RDM endpoint (native/ofi/) owned by an I/O thread in place
// of a socket. Protocol threads drive it through the same rings as the socket lanes
// (TSN_SUB_OFI_* submissions); the I/O thread posts in order (a post that meets FI_EAGAIN waits
// and is tried again), polls the completion queue every pass (providers with manual progress
// move bytes only then) and turns completions into completion records: the op token of the
// submission, or TSN_CQE_REMOTE for a peer's write with immediate data. The functions protocol
// threads call (ofiOpen, ofiRail, ofiInsertPeer, ofiRegMr, ...) are at the end.
#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#include <errno.h>
#include <napi.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "../binding.h"
#include "../internal.h"
#include "../ofi/cuda.h"
#include "../ofi/ofi.h"
#include "engine_internal.h"

namespace tsn {
namespace {

// Memory of ofiAlloc: registered, and seen by JavaScript as an ArrayBuffer. It is freed when
// both are gone, the ArrayBuffer collected and the registration deregistered, so that the
// collector can never free memory that a posted receive or a peer's key still reaches.
struct HostMem {
  void* p;
  size_t bytes;
  std::atomic<int> refs{2};
};

void hostRelease(HostMem* h) {
  if (h->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    pagesFree(h->p, h->bytes);
    delete h;
  }
}

// Registrations by number (what submissions name), with the operations in flight on each so
// that deregistration waits for them: libfabric leaves an operation on a closed region undefined.
struct MrEntry {
  OfiMr* mr = nullptr;
  std::atomic<int> inflight{0};
  HostMem* host = nullptr;  // ofiAlloc's memory under this registration, else nullptr
};
constexpr uint32_t kMrChunk = 1024, kMrChunks = 1024;
std::atomic<MrEntry*> g_mrs[kMrChunks];
std::mutex g_mu;  // discovery, domains, registration numbers
// The GPU of the first CUDA memory registered in this process on a NIC whose libfabric may call
// CUDA (-1: none yet). The I/O threads make its primary context current before they call
// libfabric with it (useGpu).
std::atomic<int> g_cudaDevice{-1};
std::vector<uint32_t> g_freeMr;
uint32_t g_nextMr = 1;
std::vector<OfiNic>* g_nics = nullptr;
std::vector<std::shared_ptr<OfiDomain>>* g_domains = nullptr;
std::string g_progress;
bool g_bell = true;  // ofiOpen's bell: endpoints without a wait fd get doorbells (TSNET_OFI_BELL)

MrEntry* mrAt(uint32_t i) {
  if (i == 0 || i / kMrChunk >= kMrChunks) return nullptr;
  MrEntry* c = g_mrs[i / kMrChunk].load(std::memory_order_acquire);
  return c ? &c[i % kMrChunk] : nullptr;
}

void* descOf(uint32_t i) {
  MrEntry* e = mrAt(i);
  OfiMr* mr = e ? __atomic_load_n(&e->mr, __ATOMIC_ACQUIRE) : nullptr;
  return mr ? mr->desc() : nullptr;
}

uint32_t flagsOf(const OfiCompletion& c) {
  uint32_t f = 0;
  if (c.flags & kOfiFlagSend) f |= TSN_CQE_F_SEND;
  if (c.flags & kOfiFlagRecv) f |= TSN_CQE_F_RECV;
  if ((c.flags & kOfiFlagWrite) && !(c.flags & kOfiFlagRemoteWrite)) f |= TSN_CQE_F_WRITE;
  if (c.flags & kOfiFlagRead) f |= TSN_CQE_F_READ;
  if (c.flags & kOfiFlagRemoteWrite) f |= TSN_CQE_F_REMOTE_WRITE;
  if (c.flags & kOfiFlagRemoteCqData) f |= TSN_CQE_F_DATA;
  if (c.op == OfiOp::kRemoteWrite) f |= TSN_CQE_F_REMOTE_WRITE;
  return f;
}

// The sender as the completion record carries it (an AV table index fits 32 bits).
uint32_t srcOf(const OfiCompletion& c) {
  return c.src > 0xfffffffeULL ? TSN_CQE_NO_SRC : static_cast<uint32_t>(c.src);
}

// Keeps the provider's words of a failed operation; the first few of a lane are logged.
void noteError(Lane* l, const std::string& words) {
  l->ofiLastError = words;
  if (++l->ofiErrors <= 3) log(kLogWarn, "ofi: lane %u: %s", l->id, words.c_str());
}

// Where libfabric may call CUDA (TSNET_OFI_CUDA_API=1), its calls (shm's cuMemGetAddressRange
// of a region it exports for IPC, its copies) run on the thread that posts or polls, and need a
// current context: tsnet's own threads have none. So once the process has registered GPU
// memory, each such I/O thread makes that GPU's primary context (NCCL's) current, once. A
// process that registers memory of several GPUs uses the first one's context; CUDA's unified
// addressing serves the others. Where endpoints make no CUDA call, g_cudaDevice stays -1.
void useGpu(IoThread* t, Lane* l) {
  int device = g_cudaDevice.load(std::memory_order_acquire);
  if (device < 0 || t->cudaDevice >= 0) return;
  t->cudaDevice = device;
  std::string why;
  static std::atomic<bool> warned{false};
  InCall in(t, l->id, IoCall::kCudaContext);
  if (!cudaMakeCurrent(device, &why) && !warned.exchange(true))
    log(kLogWarn, "ofi: I/O thread %d cannot make GPU %d's context current (%s); libfabric's CUDA calls on it may fail", t->index, device, why.c_str());
}

int post(Lane* l, Op* op) {
  OfiEndpoint* ep = l->ofi;
  bool imm = op->flags & TSN_SUB_F_IMM;
  uint64_t ctx = reinterpret_cast<uint64_t>(op);
  void* buf = op->iov[op->niov - 1].iov_base;
  size_t len = op->iov[op->niov - 1].iov_len;
  void* desc = descOf(op->mr[op->niov - 1]);
  switch (op->kind) {
    case TSN_SUB_OFI_RECV:
      return ep->recv(buf, len, desc, ctx);
    case TSN_SUB_OFI_SEND:
      if (op->niov == 2) {
        void* descs[2] = {descOf(op->mr[0]), desc};
        return ep->sendMsg(op->iov, descs, 2, op->imm, imm, op->peer, ctx);
      }
      return imm ? ep->sendData(buf, len, desc, op->imm, op->peer, ctx) : ep->send(buf, len, desc, op->peer, ctx);
    case TSN_SUB_OFI_WRITE:
      return imm ? ep->writeData(buf, len, desc, op->imm, op->peer, op->raddr, op->rkey, ctx)
                 : ep->write(buf, len, desc, op->peer, op->raddr, op->rkey, ctx);
    case TSN_SUB_OFI_READ:
      return ep->read(buf, len, desc, op->peer, op->raddr, op->rkey, ctx);
  }
  return -EINVAL;
}

}  // namespace

void ofiRelease(Op* op) {
  for (int i = 0; i < op->niov; i++)
    if (MrEntry* e = mrAt(op->mr[i])) e->inflight.fetch_sub(1, std::memory_order_release);
  op->niov = 0;
}

void ofiTake(IoThread*, Lane* l, Op* op) {
  for (int i = 0; i < op->niov; i++)
    if (MrEntry* e = mrAt(op->mr[i])) e->inflight.fetch_add(1, std::memory_order_relaxed);
  op->next = nullptr;
  if (l->ofiTail) l->ofiTail->next = op;
  else l->ofiHead = op;
  l->ofiTail = op;
  if (op->kind == TSN_SUB_OFI_RECV) l->ofiQueuedRecvs++;
}

// A close gave up on this thread while it was inside libfabric (cancelLane: the endpoint is
// abandoned, the caller gone on, NCCL free to give its memory back). Back with the lane's lock,
// the thread posts nothing more and reports nothing more: it closes the endpoint itself, which
// drops every operation still posted there (freeLane frees them).
static bool abandoned(Lane* l) {
  if (!l->quiet.load(std::memory_order_acquire)) return false;
  if (!l->closed) {
    ofiClose(l, false);
    l->closed = true;
    if (l->abandonedOpen.exchange(false)) E->ofiAbandoned.fetch_sub(1);
    log(kLogInfo, "ofi: lane %u: its I/O thread came back from libfabric after its close gave up; the endpoint is closed now",
        l->id);
  }
  return true;
}

// Posts the queue in order. A send, write or read that meets FI_EAGAIN (the provider, or the
// peer it goes to, is full) keeps its place and those after it wait behind it, but receives
// queued after it are still posted: the room that send waits for may be made only by receives
// (a burst of messages into an endpoint that has no receive left to take them fills shm's
// queues, and an endpoint whose bounce buffers waited behind its own full sends stopped for
// good; docs/io-threads.md, "Posting"). A receive that meets FI_EAGAIN
// stops the pass.
bool ofiProgress(IoThread* t, Lane* l) {
  bool more = false;
  useGpu(t, l);
  Op* prev = nullptr;  // the last op left in the queue by this pass
  bool sendsWait = false;
  for (Op* op = l->ofiHead; op;) {
    if (abandoned(l)) return false;  // here the queue and the provider agree on every op
    if (sendsWait) {
      if (!l->ofiQueuedRecvs) break;  // nothing left that may pass the waiting send
      if (op->kind != TSN_SUB_OFI_RECV) {
        prev = op;
        op = op->next;
        continue;
      }
    }
    int r;
    {
      InCall in(t, l->id, IoCall::kPost);
      r = post(l, op);
    }
    if (r == kOfiAgain) {
      more = true;  // the provider is full: polling below makes room
      if (op->kind == TSN_SUB_OFI_RECV) break;
      sendsWait = true;
      prev = op;
      op = op->next;
      continue;
    }
    Op* done = op;  // out of the queue: posted, or failed
    op = op->next;
    if (prev) prev->next = op;
    else l->ofiHead = op;
    if (l->ofiTail == done) l->ofiTail = prev;
    if (done->kind == TSN_SUB_OFI_RECV) l->ofiQueuedRecvs--;
    done->next = nullptr;
    if (r == 0 && done->kind != TSN_SUB_OFI_RECV) noteWrite(l);
    if (r == 0) continue;  // in flight: libfabric holds it until its completion
    noteError(l, l->ofi->lastError().text);
    if (!l->quiet && !(done->flags & TSN_SUB_F_NOCQE)) emit(t, l->port, done->link, done->op, r, 0);
    ofiRelease(done);
    freeOp(t, done);
  }
  if (abandoned(l)) return false;
  constexpr int kMax = 64;
  OfiCompletion cs[kMax];
  int n;
  {
    InCall in(t, l->id, IoCall::kPoll);
    n = l->ofi->poll(cs, kMax);
    if (uint32_t ms = l->testStallMs) {  // tests only: a poll that took its completions, then hung
      l->testStallMs = 0;
      usleep(ms * 1000);
    }
  }
  if (abandoned(l)) {
    // What this poll took is not reported: its ops go with the lane's dead list.
    for (int i = 0; i < n; i++)
      if (cs[i].ctx) {
        Op* op = reinterpret_cast<Op*>(cs[i].ctx);
        ofiRelease(op);
        op->next = l->dead;
        l->dead = op;
      }
    return false;
  }
  if (n < 0) {
    // The queue itself failed: nothing more will complete on this endpoint.
    noteError(l, l->ofi->lastError().text);
    emit(t, l->port, l->link, TSN_CQE_REMOTE, n, 0);
    return false;
  }
  // Completions are activity: a peer's writes landing on an endpoint this thread never posts
  // to keep it polling as closely as its own submissions would (busy-poll window, then every
  // TSNET_OFI_POLL_US for a millisecond), instead of once a millisecond while they come.
  if (n > 0) t->ofiActive = true;
  for (int i = 0; i < n; i++) {
    const OfiCompletion& c = cs[i];
    if (c.status) noteError(l, c.error);
    if (c.ctx == 0) {  // a peer's write with immediate data
      emit(t, l->port, l->link, TSN_CQE_REMOTE, c.status, static_cast<double>(c.len), c.data, flagsOf(c), srcOf(c));
      continue;
    }
    Op* op = reinterpret_cast<Op*>(c.ctx);
    double value = c.op == OfiOp::kRecv || c.op == OfiOp::kRemoteWrite ? static_cast<double>(c.len) : static_cast<double>(op->total);
    if (!(op->flags & TSN_SUB_F_NOCQE)) emit(t, l->port, op->link, op->op, c.status, value, c.data, flagsOf(c), srcOf(c));
    ofiRelease(op);
    freeOp(t, op);
  }
  return more || n == kMax;
}

bool ofiMayBlock(IoThread* t) {
  for (Lane* l : t->ofi) {
    std::lock_guard<std::mutex> g(l->mu);
    if (l->closed || l->quiet) continue;
    if (l->ofiHead) return false;
    InCall in(t, l->id, IoCall::kPoll);
    if (!l->ofi->tryWait()) return false;
  }
  return true;
}

// Whether the thread may sleep on its endpoints' bells instead of polling them on a timer:
// every endpoint of it is one without a wait fd and with a bell, and none has anything in
// flight but receives. A send's, write's or read's completion comes from the peer's progress
// (shm answers in this endpoint's region), which rings nothing, so those keep the timer.
bool ofiBellsCover(IoThread* t) {
  if (t->ofiNoWait == 0 || t->ofiBells < t->ofiNoWait || t->ofiNoWait != static_cast<int>(t->ofi.size())) return false;
  for (Lane* l : t->ofi) {
    std::lock_guard<std::mutex> g(l->mu);
    if (l->closed || l->quiet) continue;
    if (l->ofiHead || l->ofi->outgoing() > 0) return false;
  }
  return true;
}

void ofiArmBells(IoThread* t, bool arm) {
  for (Lane* l : t->ofi) {
    if (!l->ofiBell) continue;
    std::lock_guard<std::mutex> g(l->mu);
    if (arm) l->ofi->bellArm();
    else l->ofi->bellDisarm();
  }
}

void ofiBellHeard(Lane* l) {
  std::lock_guard<std::mutex> g(l->mu);
  if (l->ofi) l->ofi->bellDrain();
}

void ofiClose(Lane* l, bool drainFirst) {
  // What already completed is taken first (a post's progress may have read some), then the
  // endpoint goes; every op it still held is dropped with the lane (no completion follows).
  // Only the n entries a poll wrote are its own: the rest of cs still holds an earlier poll's
  // ops, and listing one twice would make l->dead a cycle (an endless loop below, lane lock
  // held; a later poll that gives fewer, e.g. good completions and then an error, did so).
  // An abandoned endpoint is not polled first: its memory may be NCCL's again, and a poll
  // progresses the provider, which may copy a message into a receive still posted; close()
  // takes the receives back before it reads the queue.
  OfiCompletion cs[64];
  int n;
  for (int k = 0; drainFirst && k < 1024 && (n = l->ofi->poll(cs, 64)) > 0; k++)
    for (int i = 0; i < n; i++)
      if (cs[i].ctx) {
        Op* op = reinterpret_cast<Op*>(cs[i].ctx);
        op->next = l->dead;
        l->dead = op;
      }
  int fd = l->ofi->waitFd();
  if (fd >= 0) epoll_ctl(l->t->ep, EPOLL_CTL_DEL, fd, nullptr);
  if (int bfd = l->ofi->bellFd(); bfd >= 0) epoll_ctl(l->t->ep, EPOLL_CTL_DEL, bfd, nullptr);
  for (uint64_t ctx : l->ofi->close()) {
    Op* op = reinterpret_cast<Op*>(ctx);
    op->next = l->dead;
    l->dead = op;
  }
  if (l->ofi->leftOpen())
    log(kLogInfo, "ofi: lane %u: its peer reset the connection; the endpoint is left open rather than closed (%s can crash "
        "in fi_close then: docs/ofi-facts.md)", l->id, l->ofi->domain()->nic().provider.c_str());
  for (Op* op = l->ofiHead; op;) {
    Op* next = op->next;
    op->next = l->dead;
    l->dead = op;
    op = next;
  }
  l->ofiHead = l->ofiTail = nullptr;
  l->ofiQueuedRecvs = 0;
  for (Op* op = l->dead; op; op = op->next) ofiRelease(op);
}

void ofiDelete(Lane* l) {
  delete l->ofi;  // closes an endpoint still open
  l->ofi = nullptr;
  if (l->abandonedOpen.exchange(false)) E->ofiAbandoned.fetch_sub(1);
}

namespace {

// Whether registration id holds host memory: what a protocol thread may inject from (an
// inject copies the bytes before it returns, and GPU memory would need CUDA on this thread).
bool hostMr(uint32_t id) {
  MrEntry* e = mrAt(id);
  OfiMr* mr = e ? __atomic_load_n(&e->mr, __ATOMIC_ACQUIRE) : nullptr;
  return mr && mr->device() < 0;
}

// Largest send a protocol thread gathers into one buffer to inject it.
constexpr size_t kInjectMax = 16384;

}  // namespace

// A protocol thread posts a small send, or a write with immediate data, itself: as an inject
// (fi_injectdata, fi_inject_writedata), which copies the bytes and asks for no completion, so
// the operation is complete when the call returns and no I/O thread takes part. Only where the
// endpoint keeps its order without the I/O thread: the caller saw its ring to t empty, and
// under the lane's lock (which keeps the I/O thread's own posts and polls out meanwhile) no post
// waits for room. Anything else goes the usual way: GPU memory, a write without immediate data
// (a flush's, whose completion must mean it was done), more than the provider injects, a
// provider that may call CUDA, a full provider (FI_EAGAIN) or an error (the I/O thread meets it
// again and reports it).
WriteNow ofiWriteNow(IoThread* t, Lane* l, tsn_sub_t* s, size_t addr, size_t len, size_t raddr) {
  bool imm = s->flags & TSN_SUB_F_IMM;
  bool send = s->kind == TSN_SUB_OFI_SEND;
  if (!send && !imm) return WriteNow::kNone;
  size_t hlen = send ? s->rkeyLo : 0;  // a send's header: [raddr, raddr + rkeyLo), registration rkeyHi
  size_t total = hlen + len;
  if (hlen && !raddr) return WriteNow::kNone;
  if ((len && !hostMr(s->mr)) || (hlen && !hostMr(s->rkeyHi))) return WriteNow::kNone;
  std::unique_lock<std::mutex> g(l->mu, std::try_to_lock);
  if (!g.owns_lock()) return WriteNow::kNone;  // its I/O thread is at the endpoint
  if (l->closed || l->quiet || l->ofiHead) return WriteNow::kNone;
  uint64_t now;
  if (laneStreams(l, &now)) return WriteNow::kNone;  // as for a socket (writeNow)
  const OfiNic& nic = l->ofi->domain()->nic();
  if (total > nic.injectSize || total > kInjectMax) return WriteNow::kNone;
  if (g_cudaDevice.load(std::memory_order_acquire) >= 0 && !nic.noCudaApi) return WriteNow::kNone;
  uint32_t hi;
  memcpy(&hi, s->inl, sizeof hi);
  uint64_t data = static_cast<uint64_t>(hi) << 32 | s->imm;
  const void* buf = reinterpret_cast<const void*>(addr);
  int r;
  if (send) {
    if (hlen) {  // one buffer: an inject takes no iovecs
      thread_local char gather[kInjectMax];
      memcpy(gather, reinterpret_cast<const void*>(raddr), hlen);
      if (len) memcpy(gather + hlen, buf, len);
      buf = gather;
    }
    r = imm ? l->ofi->injectData(buf, total, data, s->aux) : l->ofi->inject(buf, total, s->aux);
  } else {
    r = l->ofi->injectWriteData(buf, len, data, s->aux, raddr, static_cast<uint64_t>(s->rkeyHi) << 32 | s->rkeyLo);
  }
  if (r == 0) wroteAt(l, now);
  g.unlock();
  if (r != 0) return WriteNow::kNone;
  // A provider with manual progress may hold some of it until its endpoint is polled: the I/O
  // thread polls it as after any post (free where it is awake).
  wakeThread(t);
  return WriteNow::kAll;
}

// --- functions protocol threads call ---

namespace {

Napi::Value fail(Napi::Env env, const std::string& msg, int result = TSN_INVALID_ARGUMENT) {
  Napi::Error e = Napi::Error::New(env, msg);
  e.Set("result", Napi::Number::New(env, result));
  e.ThrowAsJavaScriptException();
  return env.Undefined();
}

double num(const Napi::CallbackInfo& info, size_t i) {
  return info.Length() > i && info[i].IsNumber() ? info[i].As<Napi::Number>().DoubleValue() : -1;
}

Lane* ownOfiLane(const Napi::CallbackInfo& info, const char* fn) {
  double id = num(info, 0);
  bool closed = id >= 0 && closedHere().count(static_cast<uint32_t>(id));  // its memory may be gone
  Lane* l = E && !closed ? laneOf(static_cast<uint32_t>(id)) : nullptr;
  if (!l || !l->ofi || l->port != bindingThreadIndex()) {
    fail(info.Env(), std::string(fn) + ": no such libfabric lane of this thread");
    return nullptr;
  }
  return l;
}

// ofiOpen({ provider, hmem, cudaApi, dmabuf, autoProgress, source }) -> { version, progress, nics: [...] }: loads libfabric
// and finds the NICs, once per process (later calls answer the first result). Throws with the
// reason when libfabric is missing or offers nothing that qualifies.
Napi::Value OfiOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_nics) {
    std::string why;
    if (!ofiLoad(&why)) return fail(env, why, TSN_SYSTEM_ERROR);
    OfiOptions o;
    Napi::Object a = info.Length() > 0 && info[0].IsObject() ? info[0].As<Napi::Object>() : Napi::Object::New(env);
    if (a.Get("provider").IsString()) o.provider = a.Get("provider").As<Napi::String>().Utf8Value();
    o.hmem = a.Get("hmem").ToBoolean().Value();
    o.cudaApi = a.Get("cudaApi").ToBoolean().Value();
    o.dmabuf = a.Get("dmabuf").ToBoolean().Value();
    if (a.Get("autoProgress").IsBoolean()) o.autoProgress = a.Get("autoProgress").ToBoolean().Value();
    if (a.Get("source").IsBoolean()) o.source = a.Get("source").ToBoolean().Value();
    if (a.Get("bell").IsBoolean()) g_bell = a.Get("bell").ToBoolean().Value();
    std::vector<OfiNic> nics = ofiDiscover(o, &why, &g_progress);
    if (nics.empty()) return fail(env, why, TSN_SYSTEM_ERROR);
    g_nics = new std::vector<OfiNic>(std::move(nics));
    g_domains = new std::vector<std::shared_ptr<OfiDomain>>(g_nics->size());
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("version", ofiVersionText());
  out.Set("progress", g_progress);
  Napi::Array list = Napi::Array::New(env, g_nics->size());
  for (size_t i = 0; i < g_nics->size(); i++) {
    const OfiNic& n = (*g_nics)[i];
    Napi::Object o = Napi::Object::New(env);
    o.Set("provider", n.provider);
    o.Set("domain", n.domain);
    o.Set("fabric", n.fabric);
    o.Set("pciPath", n.pciPath);
    o.Set("guid", Napi::BigInt::New(env, n.guid));
    o.Set("speedMbps", n.speedMbps);
    o.Set("hmem", n.hmem);
    o.Set("hmemWhy", n.hmemWhy);
    o.Set("noCudaApi", n.noCudaApi);
    o.Set("dmabuf", n.dmabuf);
    o.Set("dmabufWhy", n.dmabufWhy);
    o.Set("mixedIov", n.mixedIov);
    o.Set("virtAddr", n.virtAddr);
    o.Set("mrLocal", n.mrLocal);
    o.Set("rxCqData", n.rxCqData);
    o.Set("source", n.source);
    o.Set("sourceWrites", n.sourceWrites);
    o.Set("autoProgress", n.autoProgress);
    o.Set("maxMsgSize", static_cast<double>(n.maxMsgSize));
    o.Set("injectSize", static_cast<double>(n.injectSize));
    o.Set("cqDataBytes", static_cast<double>(n.cqDataSize));
    o.Set("describe", n.describe());
    list.Set(i, o);
  }
  out.Set("nics", list);
  return out;
}

// ofiRail(nic, thread, link, group?) -> { lane, thread, group, name, skipped }: an RDM endpoint on
// the NIC, owned by I/O thread `thread` (-1: round robin); its completions go to the calling
// protocol thread's link. group: the rails of one endpoint share their I/O threads' busy-poll
// window (engine.cc, g_groupWork); a rail given none (0 or absent) starts a new group, the
// answer's. skipped: region names shm refused as left by a killed process with this pid
// (OfiEndpoint::open).
Napi::Value OfiRail(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int nic = static_cast<int>(num(info, 0));
  int p = bindingThreadIndex();
  if (!E || p < 0 || !E->ports[p].load()) return fail(env, "ofiRail: call ioStart and ioPort first", TSN_INTERNAL_ERROR);
  double g = info.Length() > 3 && info[3].IsNumber() ? info[3].As<Napi::Number>().DoubleValue() : 0;
  if (!(g >= 0 && g <= UINT32_MAX)) return fail(env, "ofiRail: the group must be a number from 0 to 2^32 - 1");
  static std::atomic<uint32_t> groups{0};
  uint32_t group = g >= 1 ? static_cast<uint32_t>(g) : ++groups;
  std::shared_ptr<OfiDomain> domain;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_nics || nic < 0 || nic >= static_cast<int>(g_nics->size())) return fail(env, "ofiRail: no such NIC");
    if ((*g_nics)[nic].domainPerEndpoint) {  // its registrations go to it through the lane (OfiRegMr)
      OfiError err;
      domain = OfiDomain::open((*g_nics)[nic], &err, false);
      if (!domain) return fail(env, err.text, err.result);
    } else {
      if (!(*g_domains)[nic]) {
        OfiError err;
        (*g_domains)[nic] = OfiDomain::open((*g_nics)[nic], &err);
        if (!(*g_domains)[nic]) return fail(env, err.text, err.result);
      }
      domain = (*g_domains)[nic];
    }
  }
  static std::atomic<uint32_t> rr{0};
  int n = static_cast<int>(E->threads.size());
  int ti = num(info, 1) < 0 ? static_cast<int>(rr++ % n) : static_cast<int>(num(info, 1));
  if (ti < 0 || ti >= n) return fail(env, "ofiRail: no such I/O thread");
  OfiEndpointOptions o;
  o.waitFd = domain->nic().autoProgress;  // without progress of its own, a thread must poll anyway
  o.bell = g_bell;  // where it gets no wait fd (shm), a bell in its place
  OfiError err;
  std::unique_ptr<OfiEndpoint> ep = OfiEndpoint::open(domain, o, &err);
  if (!ep) return fail(env, err.text, err.result);
  Lane* l = newLane(-1, E->threads[ti], p, static_cast<uint32_t>(num(info, 2)));
  if (!l) return fail(env, "ofiRail: too many lanes", TSN_SYSTEM_ERROR);
  l->spinGroup = group;
  l->ofi = ep.release();
  // What announces a message on the endpoint (its wait fd, else its doorbell) wakes this protocol
  // thread with the I/O thread (watchLane, engine_js.cc).
  watchLane(l, l->ofi->waitFd() >= 0 ? l->ofi->waitFd() : l->ofi->bellFd());
  if (int fd = l->ofi->waitFd(); fd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = l;
    epoll_ctl(l->t->ep, EPOLL_CTL_ADD, fd, &ev);
  } else if (int bfd = l->ofi->bellFd(); bfd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = reinterpret_cast<uintptr_t>(l) | kBellTag;
    epoll_ctl(l->t->ep, EPOLL_CTL_ADD, bfd, &ev);
  } else if (o.bell) {
    log(kLogInfo, "ofi: lane %u: no doorbell (%s); its I/O thread polls it on a timer", l->id, l->ofi->bellWhy().c_str());
  }
  postAdmin(l->t, new Admin{nullptr, Admin::kAddOfi, l});
  Napi::Object out = Napi::Object::New(env);
  out.Set("lane", l->id);
  out.Set("thread", ti);
  out.Set("group", group);
  out.Set("skipped", l->ofi->shmNamesRefused());
  const std::string& name = l->ofi->name();
  out.Set("name", Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(name.data()), name.size()));
  return out;
}

// ofiInsertPeer(lane, name) -> peer: the number posts name the peer by (fi_av_insert).
Napi::Value OfiInsertPeer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownOfiLane(info, "ofiInsertPeer");
  if (!l) return env.Undefined();
  if (info.Length() < 2 || !info[1].IsTypedArray()) return fail(env, "ofiInsertPeer(lane, name) needs the peer's address bytes");
  Napi::Uint8Array name = info[1].As<Napi::Uint8Array>();
  uint64_t peer = 0;
  OfiError err;
  std::lock_guard<std::mutex> g(l->mu);
  if (l->closed || !l->ofi->insertPeer(name.Data(), name.ByteLength(), &peer, &err)) return fail(env, err.text, err.result);
  if (peer > 0xffffffffull) return fail(env, "ofiInsertPeer: the provider's address does not fit 32 bits", TSN_INTERNAL_ERROR);
  return Napi::Number::New(env, static_cast<double>(peer));
}

uint32_t addMr(OfiMr* mr) {
  std::lock_guard<std::mutex> g(g_mu);
  uint32_t i;
  if (!g_freeMr.empty()) {
    i = g_freeMr.back();
    g_freeMr.pop_back();
  } else {
    i = g_nextMr++;
    if (i / kMrChunk >= kMrChunks) return 0;
    if (!g_mrs[i / kMrChunk].load()) g_mrs[i / kMrChunk].store(new MrEntry[kMrChunk], std::memory_order_release);
  }
  __atomic_store_n(&mrAt(i)->mr, mr, __ATOMIC_RELEASE);
  return i;
}

Napi::Object mrAnswer(Napi::Env env, uint32_t id, OfiMr* mr) {
  Napi::Object out = Napi::Object::New(env);
  out.Set("mr", id);
  out.Set("keyLo", static_cast<double>(mr->key() & 0xffffffffu));
  out.Set("keyHi", static_cast<double>(mr->key() >> 32));
  out.Set("key", Napi::BigInt::New(env, mr->key()));
  // The remote address of the region's first byte; others follow by offset.
  out.Set("remoteBase", static_cast<double>(mr->remoteAddr(mr->base())));
  out.Set("ipc", mr->ipc());
  out.Set("dmabuf", mr->dmabuf());
  out.Set("device", mr->device());  // GPU ordinal, -1 for host memory
  if (!mr->ipcWhy().empty()) out.Set("ipcWhy", mr->ipcWhy());
  return out;
}

// ofiRegMr(lane, addr, len, cuda, ipc, fd, offset) -> { mr, keyLo, keyHi, key, remoteBase, ipc, dmabuf,
// device, ipcWhy? }: registers memory on the lane's NIC (and endpoint, where the provider binds
// regions to endpoints); ipc: CUDA memory with FI_HMEM_DEVICE_ONLY (OfiMemType::kCudaIpc), unless
// legacy CUDA IPC cannot export it: then a plain registration, ipc false and ipcWhy. fd (a
// number, not undefined): the region is the DMA-BUF fd's bytes from offset (FI_MR_DMABUF); the
// fd is not kept.
Napi::Value OfiRegMr(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownOfiLane(info, "ofiRegMr");
  if (!l) return env.Undefined();
  double addr = num(info, 1), len = num(info, 2);
  bool cuda = info.Length() > 3 && info[3].ToBoolean().Value();
  bool ipc = cuda && info.Length() > 4 && info[4].ToBoolean().Value();
  if (addr <= 0 || len < 0) return fail(env, "ofiRegMr(lane, addr, len, cuda) needs an address and a length");
  OfiDmaBuf dmabuf;
  bool viaDmaBuf = info.Length() > 5 && info[5].IsNumber();
  if (viaDmaBuf) {
    // Numbers that convert; OfiMr::reg checks what they mean.
    double fd = num(info, 5), offset = info.Length() > 6 ? num(info, 6) : 0;
    if (fd < 0 || fd > INT32_MAX || fd != static_cast<int>(fd) || !(offset >= 0))
      return fail(env, "ofiRegMr: DMA-BUF fd " + std::to_string(fd) + " and offset " + std::to_string(offset) +
                           " need a descriptor and an offset of 0 or more");
    dmabuf.fd = static_cast<int>(fd);
    dmabuf.offset = static_cast<uint64_t>(offset);
  }
  OfiError err;
  std::unique_ptr<OfiMr> mr = OfiMr::reg(l->ofi->domain(), reinterpret_cast<void*>(static_cast<uintptr_t>(addr)),
                                         static_cast<size_t>(len),
                                         ipc ? OfiMemType::kCudaIpc : cuda ? OfiMemType::kCuda : OfiMemType::kHost, l->ofi, &err,
                                         viaDmaBuf ? &dmabuf : nullptr);
  if (!mr) return fail(env, err.text, err.result);
  OfiMr* m = mr.release();
  uint32_t id = addMr(m);
  if (!id) {
    delete m;
    return fail(env, "ofiRegMr: too many registrations", TSN_SYSTEM_ERROR);
  }
  if (m->device() >= 0 && !l->ofi->domain()->nic().noCudaApi) {
    int none = -1;
    g_cudaDevice.compare_exchange_strong(none, m->device(), std::memory_order_acq_rel);
  }
  return mrAnswer(env, id, m);
}

// ofiDeregMr(mr, waitMs) -> operations still in flight: deregisters once no operation in
// flight names the registration, waiting up to waitMs for those that do. Where some are still
// in flight then, nothing changes and their count is returned: the caller asks again later
// (a failed comm's writes may never complete: shm drops a write whose target key is gone,
// docs/ofi-facts.md), so that no caller is held for long.
Napi::Value OfiDeregMr(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = static_cast<uint32_t>(num(info, 0));
  double waitMs = info.Length() > 1 && info[1].IsNumber() ? info[1].As<Napi::Number>().DoubleValue() : 0;
  MrEntry* e = mrAt(id);
  OfiMr* mr = e ? __atomic_load_n(&e->mr, __ATOMIC_ACQUIRE) : nullptr;
  if (!mr) return fail(env, "ofiDeregMr: no such registration");
  const uint64_t until = nowNs() + static_cast<uint64_t>(std::max(0.0, std::min(waitMs, 60'000.0)) * 1e6);
  for (int n; (n = e->inflight.load(std::memory_order_acquire)) > 0;) {
    if (nowNs() >= until) return Napi::Number::New(env, n);
    usleep(100);
  }
  __atomic_store_n(&e->mr, nullptr, __ATOMIC_RELEASE);
  delete mr;
  if (HostMem* h = __atomic_exchange_n(&e->host, nullptr, __ATOMIC_ACQ_REL)) hostRelease(h);
  std::lock_guard<std::mutex> g(g_mu);
  g_freeMr.push_back(id);
  return Napi::Number::New(env, 0);
}

// ofiAlloc(lane, bytes) -> { addr, buffer, mr, keyLo, keyHi, key, remoteBase }: registered,
// page-aligned host memory the transport owns; the memory lives as long as buffer does and
// until ofiDeregMr(mr) (HostMem), whichever is later.
Napi::Value OfiAlloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownOfiLane(info, "ofiAlloc");
  if (!l) return env.Undefined();
  double bytes = num(info, 1);
  if (bytes <= 0 || bytes > (1u << 30)) return fail(env, "ofiAlloc: bytes must be 1 .. 2^30");
  // Mapped pages: zero-filled by the kernel, resident only once touched (a comm's staging and
  // mailbox mostly are not), and unmapped when freed rather than kept by the C allocator.
  size_t n = (static_cast<size_t>(bytes) + 4095) / 4096 * 4096;
  void* mem = pagesAlloc(n);
  if (!mem) return fail(env, "ofiAlloc: out of memory", TSN_SYSTEM_ERROR);
  OfiError err;
  std::unique_ptr<OfiMr> mr = OfiMr::reg(l->ofi->domain(), mem, n, OfiMemType::kHost, l->ofi, &err);
  if (!mr) {
    pagesFree(mem, n);
    return fail(env, err.text, err.result);
  }
  OfiMr* m = mr.release();
  uint32_t id = addMr(m);
  if (id == 0) {
    delete m;
    pagesFree(mem, n);
    return fail(env, "ofiAlloc: too many registrations", TSN_SYSTEM_ERROR);
  }
  HostMem* h = new HostMem{mem, n};
  __atomic_store_n(&mrAt(id)->host, h, __ATOMIC_RELEASE);
  Napi::Object out = mrAnswer(env, id, m);
  out.Set("addr", static_cast<double>(reinterpret_cast<uintptr_t>(mem)));
  out.Set("buffer", Napi::ArrayBuffer::New(env, mem, n, [](Napi::Env, void*, HostMem* hm) { hostRelease(hm); }, h));
  return out;
}

// ofiLastError(lane): the provider's words for the lane's last failed operation.
Napi::Value OfiLastError(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = ownOfiLane(info, "ofiLastError");
  if (!l) return env.Undefined();
  std::lock_guard<std::mutex> g(l->mu);
  return Napi::String::New(env, l->ofiLastError);
}

// ofiAwaitAbandoned(ms) -> left: waits up to ms for the I/O threads to close the endpoints whose
// close gave up on them (cancelLane); returns how many are still open. The transport asks at
// the last finalize: an endpoint still open then is one the process may end with (shm's
// region then stays in /dev/shm when the process skips its exit handlers).
Napi::Value OfiAwaitAbandoned(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  double ms = 0;
  if (info.Length() > 0 && info[0].IsNumber()) ms = info[0].As<Napi::Number>().DoubleValue();
  if (!(ms >= 0 && ms <= 600000)) return fail(env, "ofiAwaitAbandoned(ms) needs 0 .. 600000");
  if (!E) return Napi::Number::New(env, 0);
  uint64_t until = nowNs() + static_cast<uint64_t>(ms * 1e6);
  while (E->ofiAbandoned.load() > 0 && nowNs() < until) {
    for (IoThread* t : E->threads) wakeThread(t);
    usleep(1000);
  }
  return Napi::Number::New(env, E->ofiAbandoned.load());
}

}  // namespace

void ofiRegister(napi_env env, napi_value exports) {
  Napi::Env e(env);
  Napi::Object o(env, exports);
  o.Set("ofiOpen", Napi::Function::New(e, OfiOpen, "ofiOpen"));
  o.Set("ofiRail", Napi::Function::New(e, OfiRail, "ofiRail"));
  o.Set("ofiInsertPeer", Napi::Function::New(e, OfiInsertPeer, "ofiInsertPeer"));
  o.Set("ofiRegMr", Napi::Function::New(e, OfiRegMr, "ofiRegMr"));
  o.Set("ofiDeregMr", Napi::Function::New(e, OfiDeregMr, "ofiDeregMr"));
  o.Set("ofiAlloc", Napi::Function::New(e, OfiAlloc, "ofiAlloc"));
  o.Set("ofiLastError", Napi::Function::New(e, OfiLastError, "ofiLastError"));
  o.Set("ofiAwaitAbandoned", Napi::Function::New(e, OfiAwaitAbandoned, "ofiAwaitAbandoned"));
}

}  // namespace tsn
