// RDM endpoints: posting operations, reading completions (errors with the provider's words),
// the wait fd, and a close that leaves nothing behind.
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sched.h>
#include <unordered_map>
#include <vector>

#include "ofi/ofi_internal.h"

namespace tsn {

#if TSN_HAVE_LIBFABRIC
namespace {

constexpr uint32_t kPendingLive = 0x6f666970;  // "ofip"
constexpr int kChunk = 256;                    // OfiPending allocated at a time, kept until close
constexpr int kBatch = 64;                     // entries per fi_cq_read
constexpr int kDrainReads = 1 << 16;           // bound on the reads close makes to empty the queue

static_assert(offsetof(OfiPending, scratch) == 0, "op_context must point at the fi_context2");
static_assert(kOfiFlagMsg == FI_MSG && kOfiFlagRma == FI_RMA && kOfiFlagRead == FI_READ && kOfiFlagWrite == FI_WRITE &&
                  kOfiFlagRecv == FI_RECV && kOfiFlagSend == FI_SEND && kOfiFlagRemoteRead == FI_REMOTE_READ &&
                  kOfiFlagRemoteWrite == FI_REMOTE_WRITE && kOfiFlagRemoteCqData == FI_REMOTE_CQ_DATA,
              "OfiCompletion::flags are libfabric's");
static_assert(kOfiAnyPeer == FI_ADDR_UNSPEC, "kOfiAnyPeer is FI_ADDR_UNSPEC");

const char* opName(OfiOp op) {
  switch (op) {
    case OfiOp::kSend: return "send";
    case OfiOp::kRecv: return "recv";
    case OfiOp::kWrite: return "write";
    case OfiOp::kRead: return "read";
    default: return "remote write";
  }
}

OfiPending* take(OfiEndpoint::Impl* m) {
  if (!m->free) {
    std::unique_ptr<OfiPending[]> chunk(new OfiPending[kChunk]);
    for (int i = 0; i < kChunk - 1; i++) chunk[i].next = &chunk[i + 1];
    m->free = &chunk[0];
    m->chunks.push_back(std::move(chunk));
  }
  OfiPending* p = m->free;
  m->free = p->next;
  p->next = p->prev = nullptr;
  return p;
}

void give(OfiEndpoint::Impl* m, OfiPending* p) {
  p->magic = 0;
  p->prev = nullptr;
  p->next = m->free;
  m->free = p;
}

void link(OfiEndpoint::Impl* m, OfiPending* p) {
  p->magic = kPendingLive;
  p->prev = m->tail;
  p->next = nullptr;
  if (m->tail) m->tail->next = p;
  else m->head = p;
  m->tail = p;
  m->inFlight++;
  if (p->op != OfiOp::kRecv) m->outgoing++;
}

void unlink(OfiEndpoint::Impl* m, OfiPending* p) {
  if (p->prev) p->prev->next = p->next;
  else m->head = p->next;
  if (p->next) p->next->prev = p->prev;
  else m->tail = p->prev;
  m->inFlight--;
  if (p->op != OfiOp::kRecv) m->outgoing--;
}

// The operation a completion's op_context names, or null when it names none of ours. Checked
// against this endpoint's own chunks before it is read: shm (1.17) puts the initiator's context
// pointer, an address in the other process, into the target's remote-write completions.
OfiPending* pendingOf(OfiEndpoint::Impl* m, void* context) {
  auto* p = static_cast<OfiPending*>(context);
  if (!p) return nullptr;
  for (auto& c : m->chunks) {
    OfiPending* first = c.get();
    if (p >= first && p < first + kChunk)
      return (reinterpret_cast<char*>(p) - reinterpret_cast<char*>(first)) % sizeof(OfiPending) == 0 &&
                     p->magic == kPendingLive
                 ? p
                 : nullptr;
  }
  return nullptr;
}

// Fills out for one CQ entry and retires its operation. A peer's write with immediate data
// names no operation of ours, except with FI_RX_CQ_DATA, where it consumed a receive.
void complete(OfiEndpoint::Impl* m, void* context, uint64_t flags, size_t len, uint64_t data, OfiCompletion* out) {
  out->flags = flags;
  out->len = len;
  out->data = data;
  bool remote = (flags & FI_REMOTE_WRITE) || ((flags & FI_REMOTE_CQ_DATA) && !(flags & FI_RECV));
  OfiPending* p = remote && !m->d->nic.rxCqData ? nullptr : pendingOf(m, context);
  if (!p) {
    out->op = OfiOp::kRemoteWrite;
    out->ctx = 0;
    if (!remote && context && out->status == 0) {  // a provider bug: never hand out a context twice
      out->status = -FI_EOTHER;
      out->error = "a completion for an operation that is not in flight (" + m->d->nic.provider + ")";
    }
    return;
  }
  out->ctx = p->ctx;
  out->op = remote ? OfiOp::kRemoteWrite : p->op;  // remote: FI_RX_CQ_DATA consumed this receive
  unlink(m, p);
  give(m, p);
}

// An error completion that says the peer reset or ended the connection: by its status, or by
// the provider's own errno (tcp: a cancelled receive says ENOTCONN there).
bool isReset(const fi_cq_err_entry& e) {
  for (int v : {std::abs(e.err), std::abs(e.prov_errno)})
    if (v == ECONNRESET || v == ECONNABORTED || v == EPIPE || v == ENOTCONN) return true;
  return false;
}

// One fi_cq_read (or fi_cq_readerr): up to max completions into out. Returns how many, or a
// negative error of the queue itself (m->last says it).
int readCq(OfiEndpoint::Impl* m, OfiCompletion* out, int max) {
  fi_cq_data_entry e[kBatch];
  fi_addr_t src[kBatch];
  const bool source = m->d->nic.source;
  size_t want = static_cast<size_t>(max < kBatch ? max : kBatch);
  // FI_SOURCE: the senders come with the entries (FI_ADDR_NOTAVAIL for one not in the AV).
  ssize_t n = source ? fi_cq_readfrom(m->cq, e, want, src) : fi_cq_read(m->cq, e, want);
  if (n > 0) {
    for (ssize_t i = 0; i < n; i++) {
      out[i].status = 0;
      out[i].provErrno = 0;
      out[i].error.clear();
      out[i].src = source ? static_cast<uint64_t>(src[i]) : ~0ULL;
      complete(m, e[i].op_context, e[i].flags, e[i].len, e[i].data, &out[i]);
    }
    return static_cast<int>(n);
  }
  if (n == -FI_EAGAIN) return 0;
  if (n != -FI_EAVAIL) {
    m->last = ofiErrorOf(static_cast<int>(n), "fi_cq_read", m->d->nic.provider);
    return static_cast<int>(n);
  }
  char data[256];
  OfiCqErr room{};
  fi_cq_err_entry& err = room.e;
  err.err_data = data;
  err.err_data_size = sizeof data;
  ssize_t r = fi_cq_readerr(m->cq, &err, 0);
  if (r == -FI_EAGAIN) return 0;
  if (r < 0) {
    m->last = ofiErrorOf(static_cast<int>(r), "fi_cq_readerr", m->d->nic.provider);
    return static_cast<int>(r);
  }
  char words[256] = "";
  const char* prov = fi_cq_strerror(m->cq, err.prov_errno, err.err_data, words, sizeof words);
  OfiCompletion& c = out[0];
  c.status = 0;
  c.provErrno = 0;
  c.error.clear();
  c.src = ~0ULL;  // an error entry names no sender (libfabric 1.17 has no src_addr there)
  complete(m, err.op_context, err.flags, err.len, err.data, &c);
  c.status = err.err > 0 ? -err.err : (err.err < 0 ? err.err : -FI_EOTHER);
  if (isReset(err)) m->peerReset = true;
  c.provErrno = err.prov_errno;
  c.error = std::string(opName(c.op)) + " failed: " + ofiStrerror(c.status) + " (" + m->d->nic.provider + ": " +
            (prov && *prov ? prov : "no details") + ")";
  return 1;
}

// This process's endpoints by name (their regions' names under shm), for insertPeer to tell a
// peer of this process. Entries of closed endpoints expire with the last peer that held them.
std::mutex g_localMu;
std::unordered_map<std::string, std::weak_ptr<LocalEndpoint>>& localByName() {
  static auto* m = new std::unordered_map<std::string, std::weak_ptr<LocalEndpoint>>();  // never destroyed: exit-time posts
  return *m;
}

// A post to peer: where it is an endpoint of this process, counted in its users for the call;
// gone() when that endpoint has closed (then nothing may be posted to it).
class LocalUse {
 public:
  LocalUse(OfiEndpoint::Impl* m, uint64_t peer) {
    if (peer >= m->local.size() || !m->local[peer]) return;
    e_ = m->local[peer].get();
    e_->users.fetch_add(1);
    if (e_->closed.load()) {
      e_->users.fetch_sub(1);
      e_ = nullptr;
      gone_ = true;
    }
  }
  ~LocalUse() {
    if (e_) e_->users.fetch_sub(1);
  }
  LocalUse(const LocalUse&) = delete;
  LocalUse& operator=(const LocalUse&) = delete;
  bool gone() const { return gone_; }

 private:
  LocalEndpoint* e_ = nullptr;
  bool gone_ = false;
};

int localGoneError(OfiEndpoint::Impl* m, const char* what) {
  m->last = ofiErrorOf(-FI_ECONNREFUSED, what, "the peer is an endpoint of this process that has closed");
  return m->last.code;
}

// Runs the provider's progress for a post that met -FI_EAGAIN; what completes waits in the backlog.
void progress(OfiEndpoint::Impl* m) {
  OfiCompletion got[16];
  int n = readCq(m, got, 16);
  for (int i = 0; i < n; i++) m->backlog.push_back(std::move(got[i]));
}

int closedError(OfiEndpoint::Impl* m, const char* what) {
  m->last = ofiErrorOf(-FI_EOPBADSTATE, what, "the endpoint is closed");
  return m->last.code;
}

// After a post to peer: its bell, where it has one and its thread sleeps armed.
void ringPeer(OfiEndpoint::Impl* m, uint64_t peer) {
  if (peer < m->peerBells.size() && m->peerBells[peer] && m->peerBells[peer]->ring())
    m->rang.fetch_add(1, std::memory_order_relaxed);
}

// Posts one operation to peer: call(context) makes the libfabric call. On -FI_EAGAIN it
// progresses once and tries once more, then gives kOfiAgain back to the caller. An endpoint of
// this process that has closed is refused (LocalUse).
template <class Call>
int post(OfiEndpoint::Impl* m, const char* what, OfiOp op, uint64_t ctx, size_t len, uint64_t peer, Call call) {
  if (m->closed) return closedError(m, what);
  LocalUse use(m, peer);
  if (use.gone()) return localGoneError(m, what);
  if (len > m->d->nic.maxMsgSize) {
    m->last = ofiErrorOf(-FI_EMSGSIZE, what, std::to_string(len) + " bytes; " + m->d->nic.provider + " takes up to " +
                                                 std::to_string(m->d->nic.maxMsgSize));
    return m->last.code;
  }
  OfiPending* p = take(m);
  p->ctx = ctx;
  p->op = op;
  ssize_t r = call(p);
  if (r == -FI_EAGAIN) {
    progress(m);
    r = call(p);
  }
  if (r == 0) {
    link(m, p);
    ringPeer(m, peer);  // a receive's peer is FI_ADDR_UNSPEC: no bell
    return 0;
  }
  give(m, p);
  if (r == -FI_EAGAIN) return kOfiAgain;
  m->last = ofiErrorOf(static_cast<int>(r), what, m->d->nic.provider);
  return m->last.code;
}

template <class Call>
int postInject(OfiEndpoint::Impl* m, const char* what, size_t len, uint64_t peer, Call call) {
  if (m->closed) return closedError(m, what);
  LocalUse use(m, peer);
  if (use.gone()) return localGoneError(m, what);
  if (len > m->d->nic.injectSize) {
    m->last = ofiErrorOf(-FI_EMSGSIZE, what, std::to_string(len) + " bytes; " + m->d->nic.provider + " injects up to " +
                                                 std::to_string(m->d->nic.injectSize));
    return m->last.code;
  }
  ssize_t r = call();
  if (r == -FI_EAGAIN) {
    progress(m);
    r = call();
  }
  if (r == 0) {
    ringPeer(m, peer);
    return 0;
  }
  if (r == -FI_EAGAIN) return kOfiAgain;
  m->last = ofiErrorOf(static_cast<int>(r), what, m->d->nic.provider);
  return m->last.code;
}

// Reads the completion queue until it is empty (or kDrainReads reads) and drops what it finds.
void drainCq(OfiEndpoint::Impl* m) {
  fi_cq_data_entry e[kBatch];
  for (int i = 0; i < kDrainReads; i++) {
    ssize_t n = fi_cq_read(m->cq, e, kBatch);
    if (n > 0) continue;
    if (n != -FI_EAVAIL) break;
    char data[256];
    OfiCqErr room{};
    fi_cq_err_entry& err = room.e;
    err.err_data = data;
    err.err_data_size = sizeof data;
    if (fi_cq_readerr(m->cq, &err, 0) < 0) break;
    if (isReset(err)) m->peerReset = true;
  }
}

void destroy(OfiEndpoint::Impl* m) {
  if (m->ep) fi_close(&m->ep->fid);
  if (m->cq) fi_close(&m->cq->fid);
  if (m->av) fi_close(&m->av->fid);
  m->ep = nullptr;
  m->cq = nullptr;
  m->av = nullptr;
}

// Opens an endpoint with its completion queue and address vector and binds them; with
// noCudaApi also forbids CUDA calls inside libfabric (FI_OPT_CUDA_API_PERMITTED = false, after
// the binds and before fi_enable). Not enabled. On failure *failed names the call.
int build(OfiEndpoint::Impl* m, const OfiEndpointOptions& o, bool noCudaApi, fi_cq_attr* cq, const char** failed) {
  const OfiNic& nic = m->d->nic;
  int rc;
  {
    OfiSignalGuard guard;  // shm installs its handlers at its first endpoint
    rc = fi_endpoint(m->d->domain, nic.info.get(), &m->ep, nullptr);
  }
  if (rc != 0) return *failed = "fi_endpoint", rc;
  cq->size = o.cqSize ? o.cqSize : nic.txSize + nic.rxSize;
  cq->format = FI_CQ_FORMAT_DATA;
  cq->wait_obj = o.waitFd ? FI_WAIT_FD : FI_WAIT_NONE;
  rc = fi_cq_open(m->d->domain, cq, &m->cq, nullptr);
  if (rc != 0 && o.waitFd) {  // no fd to sleep on: the owning thread polls
    cq->wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(m->d->domain, cq, &m->cq, nullptr);
  }
  if (rc != 0) return *failed = "fi_cq_open", rc;
  fi_av_attr av{};
  av.type = FI_AV_TABLE;
  rc = fi_av_open(m->d->domain, &av, &m->av, nullptr);
  if (rc != 0) return *failed = "fi_av_open", rc;
  rc = fi_ep_bind(m->ep, &m->av->fid, 0);
  if (rc != 0) return *failed = "fi_ep_bind (address vector)", rc;
  rc = fi_ep_bind(m->ep, &m->cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return *failed = "fi_ep_bind (completion queue)", rc;
  if (noCudaApi) {
    bool permitted = false;
    rc = fi_setopt(&m->ep->fid, FI_OPT_ENDPOINT, kOfiOptCudaApiPermitted, &permitted, sizeof permitted);
    if (rc != 0) return *failed = "fi_setopt(FI_OPT_CUDA_API_PERMITTED, false)", rc;
  }
  return 0;
}

// shm names an endpoint's region in /dev/shm after the pid ("<pid>:<uid>:<index>") and refuses
// the name (EBUSY, "shm file in use") when a file of that name gives a live owner, which this
// very process is when a killed process with the same pid left the file. shm removes the file
// as it refuses it, and the next endpoint of this process takes the next index: open tries
// again, up to this many times.
constexpr int kShmInUseRetries = 8;

std::string shmInUseNote() {
  return "; shm refused this endpoint's region name: a file of that name in /dev/shm gave pid " + std::to_string(getpid()) +
         " as its owner, this process, most likely left by a killed process with the same pid";
}

// shm maps the header of an existing file of the region name it chose, to read the owner's pid,
// without looking at the file's size: an empty one faults the process (SIGBUS inside
// fi_enable). A process killed between shm's shm_open and its ftruncate leaves one, and shm
// names regions "<pid>:..." after their process, so only files named for this pid matter. One
// empty now and still empty kEmptyRecheckUs later is such a leftover (shm sizes a region it
// creates at once): open refuses to enable the endpoint and names it. tsnet removes no file
// (/dev/shm may be another pid namespace's too; docs/ofi-facts.md). Returns its path, or "".
constexpr useconds_t kEmptyRecheckUs = 20000;

std::string emptyShmRegionOfThisPid() {
  char prefix[24];
  int plen = snprintf(prefix, sizeof prefix, "%d:", static_cast<int>(getpid()));
  std::vector<std::string> empty;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, prefix, static_cast<size_t>(plen)) != 0) continue;
      std::string path = std::string("/dev/shm/") + e->d_name;
      struct stat st;
      if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) empty.push_back(path);
    }
    closedir(d);
  }
  if (empty.empty()) return "";
  usleep(kEmptyRecheckUs);
  for (const std::string& path : empty) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) return path;
  }
  return "";
}

}  // namespace

OfiEndpoint::OfiEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OfiEndpoint::~OfiEndpoint() {
  if (impl_ && !impl_->closed) close();
}

std::unique_ptr<OfiEndpoint> OfiEndpoint::open(const std::shared_ptr<OfiDomain>& domain,
                                               const OfiEndpointOptions& o, OfiError* err) {
  if (!domain) {
    *err = ofiErrorOf(-FI_EINVAL, "OfiEndpoint::open", "no domain");
    return nullptr;
  }
  auto m = std::make_unique<Impl>();
  m->domain = domain;
  m->d = domain->impl();
  const OfiNic& nic = m->d->nic;
  auto fail = [&](int rc, const std::string& what) {
    *err = ofiErrorOf(rc, what, nic.provider + " " + nic.domain);
    destroy(m.get());
    return nullptr;
  };
  if (nic.provider == "shm") {
    std::string left = emptyShmRegionOfThisPid();
    if (!left.empty()) {
      fail(-FI_EBUSY, "fi_enable");
      err->text += "; not enabled: " + left + " is an empty file named for this process (pid " + std::to_string(getpid()) +
                   "), a region a killed process with the same pid began and never sized. libfabric's shm reads such a "
                   "file without looking at its size and would end this process with SIGBUS; remove the file";
      return nullptr;
    }
  }
  fi_cq_attr cq{};
  for (;;) {
    const char* what = "fi_enable";
    int rc = build(m.get(), o, nic.noCudaApi, &cq, &what);
    if (rc == 0) rc = fi_enable(m->ep);
    if (rc == 0) break;
    bool shmInUse = rc == -FI_EBUSY && nic.provider == "shm" && std::strcmp(what, "fi_enable") == 0;
    if (shmInUse && m->shmNamesRefused < kShmInUseRetries) {
      destroy(m.get());
      m->shmNamesRefused++;
      continue;
    }
    fail(rc, what);
    if (shmInUse) err->text += shmInUseNote();
    return nullptr;
  }
  char name[256];
  size_t len = sizeof name;
  int rc = fi_getname(&m->ep->fid, name, &len);
  if (rc != 0) return fail(rc, "fi_getname");
  m->name.assign(name, len);
  m->self = std::make_shared<LocalEndpoint>();
  {
    std::lock_guard<std::mutex> g(g_localMu);
    localByName()[m->name] = m->self;
  }
  if (cq.wait_obj == FI_WAIT_FD) {
    int fd = -1;
    if (fi_control(&m->cq->fid, FI_GETWAIT, &fd) == 0) m->waitFd = fd;
  }
  if (o.bell && m->waitFd < 0) m->bell = OfiBell::create(m->name, &m->bellWhy);
  return std::unique_ptr<OfiEndpoint>(new OfiEndpoint(std::move(m)));
}

bool ofiCudaApiOptional(const OfiNic& nic, std::string* why) {
  OfiError err;
  std::shared_ptr<OfiDomain> d = OfiDomain::open(nic, &err);
  if (!d) {
    *why = err.text;
    return false;
  }
  // A probe built as open builds an endpoint, never enabled: enabling would create shm's region.
  OfiEndpoint::Impl m;
  m.domain = d;
  m.d = d->impl();
  OfiEndpointOptions o;
  o.cqSize = 16;
  fi_cq_attr cq{};
  const char* what = "";
  int rc = build(&m, o, true, &cq, &what);
  destroy(&m);
  if (rc != 0) *why = std::string(what) + ": " + ofiStrerror(rc);
  return rc == 0;
}

const std::shared_ptr<OfiDomain>& OfiEndpoint::domain() const { return impl_->domain; }
int OfiEndpoint::shmNamesRefused() const { return impl_->shmNamesRefused; }
const std::string& OfiEndpoint::name() const { return impl_->name; }
const OfiError& OfiEndpoint::lastError() const { return impl_->last; }
bool OfiEndpoint::leftOpen() const { return impl_->leftOpen; }
size_t OfiEndpoint::inFlight() const { return impl_->inFlight; }
int OfiEndpoint::waitFd() const { return impl_->closed ? -1 : impl_->waitFd; }
int OfiEndpoint::bellFd() const { return impl_->closed || !impl_->bell ? -1 : impl_->bell->fd; }
const std::string& OfiEndpoint::bellWhy() const { return impl_->bellWhy; }
void OfiEndpoint::bellArm() {
  if (impl_->bell) impl_->bell->page->asleep.store(1, std::memory_order_seq_cst);
}
void OfiEndpoint::bellDisarm() {
  if (impl_->bell) impl_->bell->page->asleep.store(0, std::memory_order_relaxed);
}
void OfiEndpoint::bellDrain() {
  if (!impl_->bell) return;
  char buf[64];
  while (::recv(impl_->bell->fd, buf, sizeof buf, MSG_DONTWAIT) >= 0) impl_->bell->heard.fetch_add(1, std::memory_order_relaxed);
}
size_t OfiEndpoint::outgoing() const { return impl_->outgoing; }
uint64_t OfiEndpoint::bellRang() const { return impl_->rang.load(std::memory_order_relaxed); }
uint64_t OfiEndpoint::bellHeard() const { return impl_->bell ? impl_->bell->heard.load(std::memory_order_relaxed) : 0; }

bool OfiEndpoint::insertPeer(const void* name, size_t len, uint64_t* peer, OfiError* err) {
  Impl* m = impl_.get();
  if (m->closed) {
    *err = ofiErrorOf(-FI_EOPBADSTATE, "fi_av_insert", "the endpoint is closed");
    return false;
  }
  std::string copy(static_cast<const char*>(name), len);  // shm's names are strings: keep a NUL after them
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  int n = fi_av_insert(m->av, copy.c_str(), 1, &addr, 0, nullptr);
  if (n != 1 || addr == FI_ADDR_NOTAVAIL) {
    *err = ofiErrorOf(n < 0 ? n : -FI_EINVAL, "fi_av_insert of a peer's address", m->d->nic.provider);
    return false;
  }
  *peer = addr;
  std::shared_ptr<LocalEndpoint> here;
  {
    std::lock_guard<std::mutex> g(g_localMu);
    auto it = localByName().find(std::string(static_cast<const char*>(name), len));
    if (it != localByName().end()) here = it->second.lock();
  }
  if (here && here != m->self && addr < (1u << 20)) {  // FI_AV_TABLE numbers from 0
    if (m->local.size() <= addr) m->local.resize(addr + 1);
    m->local[addr] = std::move(here);
  }
  // A peer without a wait fd (the same provider as this endpoint) may have a bell to ring.
  if (m->waitFd < 0 && addr < (1u << 20)) {
    if (m->peerBells.size() <= addr) m->peerBells.resize(addr + 1);
    m->peerBells[addr] = OfiPeerBell::open(std::string(static_cast<const char*>(name), len));
  }
  return true;
}

bool OfiEndpoint::removePeer(uint64_t peer, OfiError* err) {
  Impl* m = impl_.get();
  if (m->closed) return true;
  fi_addr_t addr = peer;
  int rc = fi_av_remove(m->av, &addr, 1, 0);
  if (rc != 0) {
    *err = ofiErrorOf(rc, "fi_av_remove", m->d->nic.provider);
    return false;
  }
  return true;
}

int OfiEndpoint::recv(void* buf, size_t len, void* desc, uint64_t ctx, uint64_t peer) {
  Impl* m = impl_.get();
  return post(m, "fi_recv", OfiOp::kRecv, ctx, len, FI_ADDR_UNSPEC,
              [&](OfiPending* p) { return fi_recv(m->ep, buf, len, desc, peer, p); });
}

int OfiEndpoint::send(const void* buf, size_t len, void* desc, uint64_t peer, uint64_t ctx) {
  Impl* m = impl_.get();
  return post(m, "fi_send", OfiOp::kSend, ctx, len, peer,
              [&](OfiPending* p) { return fi_send(m->ep, buf, len, desc, peer, p); });
}

int OfiEndpoint::sendData(const void* buf, size_t len, void* desc, uint64_t imm, uint64_t peer, uint64_t ctx) {
  Impl* m = impl_.get();
  return post(m, "fi_senddata", OfiOp::kSend, ctx, len, peer,
              [&](OfiPending* p) { return fi_senddata(m->ep, buf, len, desc, imm, peer, p); });
}

int OfiEndpoint::sendMsg(const iovec* iov, void** desc, size_t count, uint64_t imm, bool withImm, uint64_t peer,
                         uint64_t ctx) {
  Impl* m = impl_.get();
  size_t len = 0;
  for (size_t i = 0; i < count; i++) len += iov[i].iov_len;
  return post(m, "fi_sendmsg", OfiOp::kSend, ctx, len, peer, [&](OfiPending* p) {
    fi_msg msg{};
    msg.msg_iov = iov;
    msg.desc = desc;
    msg.iov_count = count;
    msg.addr = peer;
    msg.context = p;
    msg.data = imm;
    return fi_sendmsg(m->ep, &msg, FI_COMPLETION | (withImm ? FI_REMOTE_CQ_DATA : 0));
  });
}

int OfiEndpoint::inject(const void* buf, size_t len, uint64_t peer) {
  Impl* m = impl_.get();
  return postInject(m, "fi_inject", len, peer, [&] { return fi_inject(m->ep, buf, len, peer); });
}

int OfiEndpoint::injectData(const void* buf, size_t len, uint64_t imm, uint64_t peer) {
  Impl* m = impl_.get();
  return postInject(m, "fi_injectdata", len, peer, [&] { return fi_injectdata(m->ep, buf, len, imm, peer); });
}

int OfiEndpoint::injectWriteData(const void* buf, size_t len, uint64_t imm, uint64_t peer, uint64_t raddr,
                                 uint64_t rkey) {
  Impl* m = impl_.get();
  return postInject(m, "fi_inject_writedata", len, peer,
                    [&] { return fi_inject_writedata(m->ep, buf, len, imm, peer, raddr, rkey); });
}

int OfiEndpoint::write(const void* buf, size_t len, void* desc, uint64_t peer, uint64_t raddr, uint64_t rkey,
                       uint64_t ctx) {
  Impl* m = impl_.get();
  return post(m, "fi_write", OfiOp::kWrite, ctx, len, peer,
              [&](OfiPending* p) { return fi_write(m->ep, buf, len, desc, peer, raddr, rkey, p); });
}

int OfiEndpoint::writeData(const void* buf, size_t len, void* desc, uint64_t imm, uint64_t peer, uint64_t raddr,
                           uint64_t rkey, uint64_t ctx) {
  Impl* m = impl_.get();
  return post(m, "fi_writedata", OfiOp::kWrite, ctx, len, peer,
              [&](OfiPending* p) { return fi_writedata(m->ep, buf, len, desc, imm, peer, raddr, rkey, p); });
}

int OfiEndpoint::read(void* buf, size_t len, void* desc, uint64_t peer, uint64_t raddr, uint64_t rkey, uint64_t ctx) {
  Impl* m = impl_.get();
  return post(m, "fi_read", OfiOp::kRead, ctx, len, peer,
              [&](OfiPending* p) { return fi_read(m->ep, buf, len, desc, peer, raddr, rkey, p); });
}

int OfiEndpoint::poll(OfiCompletion* out, int max) {
  Impl* m = impl_.get();
  if (m->closed) return closedError(m, "poll");
  int n = 0;
  while (n < max && !m->backlog.empty()) {
    out[n++] = std::move(m->backlog.front());
    m->backlog.pop_front();
  }
  while (n < max) {
    int want = max - n < kBatch ? max - n : kBatch;
    int r = readCq(m, out + n, want);
    if (r < 0) return n > 0 ? n : r;  // the queue's own error: reported once nothing else is
    n += r;
    if (r < want) break;
  }
  return n;
}

bool OfiEndpoint::tryWait() {
  Impl* m = impl_.get();
  if (m->closed || m->waitFd < 0 || !m->backlog.empty()) return false;
  fid* f = &m->cq->fid;
  return fi_trywait(m->d->fabric, &f, 1) == 0;
}

std::vector<uint64_t> OfiEndpoint::close() {
  Impl* m = impl_.get();
  std::vector<uint64_t> unfinished;
  if (m->closed) return unfinished;
  m->closed = true;
  if (m->self) {
    // Peers of this process post nothing to it from now on; one in the middle of a post ends it first.
    m->self->closed.store(true);
    while (m->self->users.load() != 0) sched_yield();
  }
  for (OfiPending* p = m->head; p; p = p->next) {
    unfinished.push_back(p->ctx);
    // Receives can be taken back; sends, writes and reads end with the endpoint.
    if (p->op == OfiOp::kRecv) fi_cancel(&m->ep->fid, p);
  }
  // Let the provider finish what it has queued (cancellations, errors of a broken connection)
  // before the endpoint goes: tcp;ofi_rxm 1.17 sometimes crashes in fi_close when an endpoint
  // whose peer reset the connection is closed with that still unread (docs/ofi-facts.md).
  drainCq(m);
  bool reads = false;
  for (OfiPending* p = m->head; p; p = p->next) reads = reads || p->op == OfiOp::kRead;
  if (m->peerReset && !reads && m->d->nic.provider.rfind("tcp", 0) == 0) {
    // tcp;ofi_rxm: fi_close of an endpoint whose peer reset the connection can crash inside
    // the provider, drained or not (docs/ofi-facts.md). Its receives are cancelled and their
    // completions read; sends and writes only read local memory. Left open, it and its queue
    // are never read again.
    m->leftOpen = true;
    m->ep = nullptr;
    m->cq = nullptr;
    m->av = nullptr;
    // What the open endpoint may still refer to stays too: the operations' contexts (a
    // provider may use them until it completes them) and the domain (not closed under it).
    for (auto& c : m->chunks) (void)c.release();
    (void)new std::shared_ptr<OfiDomain>(m->domain);
  } else {
    int rc = fi_close(&m->ep->fid);
    if (rc != 0) m->last = ofiErrorOf(rc, "fi_close of the endpoint", m->d->nic.provider);
    m->ep = nullptr;
    // Whatever the endpoint queued while it closed is read and dropped here; the queue then goes
    // with it, so nothing of this endpoint can reach anything opened later.
    drainCq(m);
    destroy(m);
  }
  m->backlog.clear();
  m->head = m->tail = m->free = nullptr;
  m->inFlight = 0;
  m->outgoing = 0;
  m->chunks.clear();
  m->waitFd = -1;
  m->bell.reset();  // its files go: a peer's ring finds no one
  m->peerBells.clear();
  return unfinished;
}

#else

struct OfiEndpoint::Impl {
  std::shared_ptr<OfiDomain> domain;
  std::string name;
  OfiError last;
  bool closed = true;
};
OfiEndpoint::OfiEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OfiEndpoint::~OfiEndpoint() = default;
std::unique_ptr<OfiEndpoint> OfiEndpoint::open(const std::shared_ptr<OfiDomain>&, const OfiEndpointOptions&,
                                               OfiError* err) {
  ofiLoad(&err->text);
  err->code = -38;
  err->result = ofiResultOf(err->code);
  return nullptr;
}
const std::shared_ptr<OfiDomain>& OfiEndpoint::domain() const { return impl_->domain; }
int OfiEndpoint::shmNamesRefused() const { return 0; }
bool ofiCudaApiOptional(const OfiNic&, std::string* why) {
  ofiLoad(why);
  return false;
}
const std::string& OfiEndpoint::name() const { return impl_->name; }
const OfiError& OfiEndpoint::lastError() const { return impl_->last; }
bool OfiEndpoint::leftOpen() const { return false; }
size_t OfiEndpoint::inFlight() const { return 0; }
int OfiEndpoint::waitFd() const { return -1; }
int OfiEndpoint::bellFd() const { return -1; }
const std::string& OfiEndpoint::bellWhy() const { return impl_->name; }
void OfiEndpoint::bellArm() {}
void OfiEndpoint::bellDisarm() {}
void OfiEndpoint::bellDrain() {}
size_t OfiEndpoint::outgoing() const { return 0; }
uint64_t OfiEndpoint::bellRang() const { return 0; }
uint64_t OfiEndpoint::bellHeard() const { return 0; }
bool OfiEndpoint::insertPeer(const void*, size_t, uint64_t*, OfiError*) { return false; }
bool OfiEndpoint::removePeer(uint64_t, OfiError*) { return false; }
int OfiEndpoint::recv(void*, size_t, void*, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::send(const void*, size_t, void*, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::sendData(const void*, size_t, void*, uint64_t, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::sendMsg(const iovec*, void**, size_t, uint64_t, bool, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::inject(const void*, size_t, uint64_t) { return -38; }
int OfiEndpoint::injectData(const void*, size_t, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::injectWriteData(const void*, size_t, uint64_t, uint64_t, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::write(const void*, size_t, void*, uint64_t, uint64_t, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::writeData(const void*, size_t, void*, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::read(void*, size_t, void*, uint64_t, uint64_t, uint64_t, uint64_t) { return -38; }
int OfiEndpoint::poll(OfiCompletion*, int) { return -38; }
bool OfiEndpoint::tryWait() { return false; }
std::vector<uint64_t> OfiEndpoint::close() { return {}; }

#endif

}  // namespace tsn
