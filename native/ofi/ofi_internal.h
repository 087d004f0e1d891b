// What the files of native/ofi/ share: the libfabric entry points opened at run time and the
// objects behind OfiDomain and OfiEndpoint. Only these files include libfabric's headers.
#pragma once
#include "ofi/ofi.h"

#if __has_include(<rdma/fabric.h>) && !defined(TSN_OFI_NO_LIBFABRIC)  // the latter to test the stub
#define TSN_HAVE_LIBFABRIC 1
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#else
#define TSN_HAVE_LIBFABRIC 0
#endif

#include <signal.h>
#include <sys/un.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace tsn {

// The host owns its signals, but loading libfabric and opening its objects installs handlers:
// Debian's and Ubuntu's libfabric links libpsm_infinipath, whose constructor takes SIGINT,
// SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT at dlopen; shm takes SIGINT, SIGTERM, SIGSEGV and
// SIGBUS at its first endpoint. Every such call runs under this guard, which puts back any
// handler that changed while it lived.
class OfiSignalGuard {
 public:
  OfiSignalGuard() {
    for (int i = 0; i < kN; i++) sigaction(kSigs[i], nullptr, &saved_[i]);
  }
  ~OfiSignalGuard() {
    for (int i = 0; i < kN; i++) {
      struct sigaction now;
      if (sigaction(kSigs[i], nullptr, &now) != 0) continue;
      if (now.sa_sigaction != saved_[i].sa_sigaction || now.sa_flags != saved_[i].sa_flags)
        sigaction(kSigs[i], &saved_[i], nullptr);
    }
  }
  OfiSignalGuard(const OfiSignalGuard&) = delete;
  OfiSignalGuard& operator=(const OfiSignalGuard&) = delete;

 private:
  static constexpr int kN = 12;
  static constexpr int kSigs[kN] = {SIGHUP,  SIGINT,  SIGQUIT, SIGILL,  SIGABRT, SIGFPE,
                                    SIGBUS,  SIGSEGV, SIGPIPE, SIGTERM, SIGUSR1, SIGUSR2};
  struct sigaction saved_[kN];
};

// FNV-1a, 64 bits: a NIC's guid from its identity (ofi_discover.cc), a doorbell's name from its
// endpoint's address (ofi_bell.cc).
inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// --- doorbells (ofi_bell.cc) ---
// shm offers no wait fd, so an I/O thread serving a shm endpoint could only sleep on a timer
// (1 ms, 50 us in the first ms after work): a message that came while it slept waited for the
// timer. A bell is what a wait fd would be, across processes: the endpoint's page in /dev/shm
// says whether its thread sleeps, and its datagram socket beside it wakes that thread. Both are
// named after the endpoint's address (which a peer has), through a hash.

// The shared page: its owner writes magic last, so a peer that reads it sees the rest.
struct OfiBellPage {
  std::atomic<uint32_t> magic;
  uint32_t version;
  int32_t owner;                  // the pid that made it: a bell of a dead process is swept away
  uint32_t pad;
  std::atomic<uint32_t> asleep;   // 1: armed; a poster that swaps it to 0 rings
  uint32_t pad2;
  uint64_t ownerStart;            // the owner's start time (/proc/<pid>/stat): tells a reused pid
};

// An endpoint's own bell.
struct OfiBell {
  int fd = -1;
  OfiBellPage* page = nullptr;
  std::string shmName;   // for shm_open / shm_unlink
  std::string sockPath;
  pid_t owner = 0;       // the process that made it: only it removes the files
  std::atomic<uint64_t> heard{0};
  // nullptr with *why where it cannot be made (the endpoint then sleeps on the timer).
  static std::unique_ptr<OfiBell> create(const std::string& endpointName, std::string* why);
  ~OfiBell();
};

// A peer endpoint's bell as its posters see it: its page mapped, its socket's address.
struct OfiPeerBell {
  OfiBellPage* page = nullptr;
  sockaddr_un addr{};
  socklen_t addrLen = 0;
  // nullptr where the peer has none (a provider with a wait fd, or an older build).
  static std::shared_ptr<OfiPeerBell> open(const std::string& endpointName);
  // After a post to the peer: where its thread sleeps armed, wakes it (once per arming).
  // Returns true when it rang.
  bool ring();
  ~OfiPeerBell();
};

#if TSN_HAVE_LIBFABRIC

// The only real symbols used; everything else in libfabric's API is static inline and calls
// through the objects' ops tables, so the library gains no link-time dependency on libfabric.
struct OfiLib {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;
  decltype(&::fi_version) version = nullptr;
  uint32_t runtime = 0;  // fi_version()
  uint32_t api = 0;      // the API version asked for: min(runtime, kOfiMaxApi)
};
// Valid after ofiLoad returned true.
const OfiLib& ofiLib();

// An OfiError for a failed call: "<what>: <fi_strerror> [(<detail>)]".
OfiError ofiErrorOf(int code, const std::string& what, const std::string& detail = "");

// Whether this libfabric registers CUDA memory on the NIC's domain at all (docs/ofi-facts.md).
bool ofiCudaRegistrable(const OfiNic& nic, std::string* why);

// FI_OPT_CUDA_API_PERMITTED (libfabric 1.18; these headers may be older): after
// FI_OPT_XPU_TRIGGER in fi_endpoint.h's option names.
constexpr int kOfiOptCudaApiPermitted = FI_OPT_XPU_TRIGGER + 1;

// The newest libfabric API this layer asks for. libfabric reads and writes some structures by
// the API asked for, not by the headers a program was built with (Debian's and Ubuntu's are
// 1.17): from 1.19 it reads fi_mr_attr.hmem_data, from 1.20 a DMA-BUF registration's
// fi_mr_dmabuf and domain_attr.max_ep_auth_key (hints come from fi_dupinfo, so the library's
// own size), from 1.20 it writes fi_cq_err_entry.src_addr, from 1.22 it reads
// fi_mr_attr.page_size. Every structure this layer passes is laid out for this API: OfiMrAttr
// and OfiCqErr below. Raise it only with those.
constexpr uint32_t kOfiMaxApi = FI_VERSION(1, 22);
// The first API with FI_MR_DMABUF.
constexpr uint32_t kOfiDmaBufApi = FI_VERSION(1, 20);
// FI_MR_DMABUF (libfabric 1.20; these headers may be older).
constexpr uint64_t kOfiMrDmaBuf = 1ULL << 40;
#ifdef FI_MR_DMABUF
static_assert(FI_MR_DMABUF == kOfiMrDmaBuf, "FI_MR_DMABUF");
#endif

// struct fi_mr_dmabuf (libfabric 1.20).
struct OfiMrDmaBuf {
  int fd;
  uint64_t offset;   // of the region within the DMA-BUF
  size_t len;
  void* base_addr;   // the virtual address of the DMA-BUF's first byte: the region is mapped at base_addr + offset
};

// struct fi_mr_attr as API 1.22 lays it out. The headers' fields keep their offsets (asserted in
// ofi_domain.cc); hmem_data (API 1.19) and page_size (1.22) follow them.
struct OfiMrAttr {
  union {
    const iovec* mr_iov;
    const OfiMrDmaBuf* dmabuf;  // with FI_MR_DMABUF (API 1.20)
  };
  size_t iov_count;
  uint64_t access;
  uint64_t offset;
  uint64_t requested_key;
  void* context;
  size_t auth_key_size;
  uint8_t* auth_key;
  fi_hmem_iface iface;
  union {
    uint64_t reserved;
    int cuda;
    int ze;
    int neuron;
    int synapseai;
  } device;
  void* hmem_data;
  size_t page_size;
};

// fi_mr_regattr with an OfiMrAttr.
int ofiMrRegattr(fid_domain* domain, const OfiMrAttr& attr, uint64_t flags, fid_mr** mr);

// Room for fi_cq_err_entry as any API up to kOfiMaxApi writes it (1.20 appended src_addr).
struct OfiCqErr {
  fi_cq_err_entry e;
  uint64_t tail[4];  // never read
};

struct OfiDomain::Impl {
  OfiNic nic;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  std::atomic<uint64_t> nextKey{1};  // registrations numbered, for the keys this layer picks when
                                     // the provider does not (!FI_MR_PROV_KEY)
  uint64_t keyMul = 1, keyAdd = 0;   // the keyed permutation of those numbers (pickKey)
  // A key for the next registration: distinct within the domain (a bijection of a counter, over
  // 30 bits) and not a small counter a stranger could guess, since a key is all that guards a
  // region against remote writes and reads (tcp; shm checks keys only on some paths).
  uint64_t pickKey();
};

// One posted operation. op_context points at it, so the provider may use its first bytes as
// scratch (mode FI_CONTEXT / FI_CONTEXT2).
struct OfiPending {
  fi_context2 scratch;  // first: the provider's, under FI_CONTEXT / FI_CONTEXT2
  uint64_t ctx = 0;     // the caller's
  OfiPending* prev = nullptr;  // in flight: post order; free: next only
  OfiPending* next = nullptr;
  uint32_t magic = 0;   // kPendingLive while posted
  OfiOp op = OfiOp::kSend;
};

// An endpoint of this process as its peers in this process see it. shm reaches an endpoint of
// its own process through that endpoint's region directly, which is unmapped once it closes: a
// send, write or read to it must not start after that, nor be under way while it closes. A
// post to such a peer counts itself in `users` and checks `closed`; close sets `closed` and
// waits for `users` to drop to 0 before fi_close (both sequentially consistent).
struct LocalEndpoint {
  std::atomic<int> users{0};
  std::atomic<bool> closed{false};
};

struct OfiEndpoint::Impl {
  std::shared_ptr<OfiDomain> domain;
  std::shared_ptr<LocalEndpoint> self;  // this endpoint, as its peers in this process hold it
  // By AV id: the endpoint of this process that address names, or null (another process's).
  std::vector<std::shared_ptr<LocalEndpoint>> local;
  OfiDomain::Impl* d = nullptr;
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  int waitFd = -1;
  std::string name;
  OfiError last;
  bool closed = false;
  bool peerReset = false;  // a completion failed because the peer reset or ended the connection
  bool leftOpen = false;   // close() left the endpoint open (OfiEndpoint::close)
  int shmNamesRefused = 0;  // region names shm refused as left by a killed process with this pid
  std::deque<OfiCompletion> backlog;  // read while progressing for a post; poll returns these first
  std::unique_ptr<OfiBell> bell;      // this endpoint's doorbell (OfiEndpointOptions::bell), or null
  std::string bellWhy;                // why it has none, where one was asked for
  // By AV id: the peer's bell, or null (posts under the lane's lock read and insertPeer writes it).
  std::vector<std::shared_ptr<OfiPeerBell>> peerBells;
  std::atomic<uint64_t> rang{0};      // rings this endpoint's posts made
  size_t outgoing = 0;                // in flight and not receives
  // Operations in flight, oldest first, and the free ones.
  OfiPending* head = nullptr;
  OfiPending* tail = nullptr;
  OfiPending* free = nullptr;
  size_t inFlight = 0;
  std::vector<std::unique_ptr<OfiPending[]>> chunks;
};

#endif

}  // namespace tsn
