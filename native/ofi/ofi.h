// The native half of the libfabric transport: a small C++ layer over libfabric that opens the
// library at run time, finds NICs, registers memory, and posts and completes operations on
// RDM endpoints. It makes no protocol decisions and does not log: every failure comes back as
// an OfiError (the NCCL result code and the words of libfabric and the provider) for the
// caller to log. docs/ofi-facts.md has what the providers do; docs/rdma-protocol.md the
// protocol built on top.
//
// Signals: the host keeps its handlers. libfabric and its providers install some when loaded
// and when opening objects; every such call here puts the host's back (docs/ofi-facts.md).
//
// Threads: ofiLoad and ofiDiscover may run on any thread. An OfiDomain is shared by every
// endpoint of its NIC in the process; registering memory is safe while other threads use the
// domain's endpoints (discovery asks for FI_THREAD_COMPLETION, or stronger). An OfiEndpoint and
// its completion queue belong to one thread at a time: posts, poll, tryWait and close must not
// run concurrently on one endpoint. Open endpoints on a thread that blocks the host's signals:
// a provider thread (tcp;ofi_rxm's, with FI_PROGRESS_AUTO) inherits that thread's mask.
//
// This header does not include libfabric's: the rest of the shim builds where they are absent.
#pragma once
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct fi_info;

namespace tsn {

// --- errors ---

// A failure: what failed, in words the caller can log as they are.
struct OfiError {
  int code = 0;      // negative libfabric error (-FI_E*, equal to -errno for the errno ones); 0: none
  int result = 0;    // the NCCL result code (TSN_* in native/generated/tsnet_abi.h)
  std::string text;  // "fi_writedata: Connection reset by peer (tcp;ofi_rxm: ...)"
};

// The one table from libfabric errors to NCCL result codes: a peer that went away
// (ECONNRESET, ECONNREFUSED, ECONNABORTED, EHOSTUNREACH, ENETUNREACH, ENOTCONN, ESHUTDOWN,
// EPIPE, ETIMEDOUT, EREMOTEIO) is a remote error; bad input (EINVAL, EMSGSIZE, EACCES,
// EOPNOTSUPP, ENOSYS, EKEYREJECTED, FI_EBADFLAGS, FI_ENOKEY) an invalid argument; a message
// larger than its receive (FI_ETRUNC) invalid usage; everything else (EIO, ECANCELED, FI_E*
// of the provider) a system error.
int ofiResultOf(int code);

// libfabric's words for an error (fi_strerror); "libfabric not loaded" before ofiLoad.
std::string ofiStrerror(int code);

// --- the library ---

// Opens libfabric once per process: dlopen(RTLD_NOW | RTLD_LOCAL) of $TSNET_LIBFABRIC, else
// "libfabric.so.1". Needs API 1.10 or newer (FI_HMEM and the fi_mr_attr fields this layer
// uses). False with the reason when the library is missing or too old; then nothing else here
// works, and the TCP transport is unaffected. Later calls return the first answer.
bool ofiLoad(std::string* why);

// The loaded library's version, FI_VERSION(major, minor) (major << 16 | minor); 0 before ofiLoad.
uint32_t ofiVersion();
// The API version asked for at fi_getinfo: the library's own, up to 1.22 (the newest whose
// structures this layer lays out); 0 before ofiLoad.
uint32_t ofiApiVersion();
// "1.17" and the API version asked for at fi_getinfo, e.g. "libfabric 1.17 (API 1.17)".
std::string ofiVersionText();

// --- discovery ---

struct OfiOptions {
  std::string provider;   // keep only this provider ("tcp", "shm", "tcp;ofi_rxm"); empty: the first
                          // one that qualifies. libfabric applies FI_PROVIDER itself before this.
  bool hmem = false;      // ask for FI_HMEM (GPU memory); falls back to host memory, with the reason
  bool cudaApi = false;   // GPU memory even through a provider that calls CUDA (cudaMemcpy ...) inside
                          // libfabric on tsnet's threads; false: only where endpoints accept
                          // FI_OPT_CUDA_API_PERMITTED = false (libfabric's fabric(7), "CUDA deadlock").
                          // Where they accept it, it is set either way.
  bool dmabuf = false;    // with hmem: offer DMA-BUF registration where libfabric's API (1.20), the
                          // kernel (5.12, RDMA's DMA-BUF import) and every GPU (CUDA's
                          // DMA_BUF_SUPPORTED) allow it, as aws-ofi-nccl does; OfiNic::dmabuf says
  bool rxCqData = false;  // accept providers that consume a posted receive for remote CQ data
                          // (mode FI_RX_CQ_DATA); off like aws-ofi-nccl's RDMA protocol
  bool autoProgress = true;  // ask for FI_PROGRESS_AUTO first, then FI_PROGRESS_MANUAL
  bool source = true;        // ask for FI_SOURCE (completions name the sender), then without it
  bool ipv6 = false;         // tcp: keep IPv6 interfaces too (OFI_NCCL_USE_IPV6_TCP)
  std::string excludeIf = "lo,docker0";  // tcp: interfaces to skip (OFI_NCCL_EXCLUDE_TCP_IF)
};

// One NIC: a libfabric domain of the chosen provider, with what the protocol needs to know.
struct OfiNic {
  std::string provider;    // fabric_attr->prov_name, e.g. "tcp;ofi_rxm"
  std::string fabric;      // fabric_attr->name, e.g. "192.0.2.0/24"
  std::string domain;      // domain_attr->name: the interface for tcp, "shm" for shm
  std::string pciPath;     // the PCI device's sysfs directory (a realpath, as NCCL wants it), from
                           // fi_info's bus attributes or the interface's sysfs entry; "" if unknown
  std::string identity;    // provider/domain/PCI address or fabric/host name: the same in every
                           // process of the host, different on other hosts
  uint64_t guid = 0;       // 64-bit hash of identity, for getProperties
  int speedMbps = 0;       // link speed; 0 when neither fi_info nor sysfs knows it
  uint64_t mrMode = 0;     // FI_MR_* bits granted
  bool virtAddr = false;   // FI_MR_VIRT_ADDR: remote addresses are virtual addresses
  bool provKey = false;    // FI_MR_PROV_KEY: the provider picks keys (else this layer does)
  bool mrLocal = false;    // FI_MR_LOCAL: local buffers need a registration's desc
  bool mrEndpoint = false; // FI_MR_ENDPOINT: regions are registered per endpoint
  bool hmem = false;       // FI_HMEM granted: GPU memory can be registered (iface permitting)
  bool dmabuf = false;     // hmem, and GPU memory may be registered through a DMA-BUF (OfiOptions::dmabuf)
  std::string dmabufWhy;   // why dmabuf is false, when it was asked for and hmem granted
  std::string hmemWhy;     // why hmem is false, when it was asked for
  bool noCudaApi = false;  // hmem, and every endpoint is opened with FI_OPT_CUDA_API_PERMITTED =
                           // false: libfabric makes no CUDA call; else (hmem) it may
  bool domainPerEndpoint = false;  // each endpoint opens a fabric and domain of its own (shm: its
                           // cache of peers' CUDA IPC mappings is per domain but keyed by each
                           // endpoint's own peer numbers, docs/ofi-facts.md)
  bool mixedIov = true;    // one send may gather host and GPU memory: libfabric 1.18+; 1.17's shm
                           // copies every iovec of a send as the first one's memory
  bool autoProgress = false;  // data progress FI_PROGRESS_AUTO; else MANUAL: poll to progress
  bool rxCqData = false;      // mode FI_RX_CQ_DATA: remote CQ data consumes a posted receive
  bool source = false;        // FI_SOURCE granted: a message's completion names its sender
                              // (OfiCompletion::src)
  bool sourceWrites = false;  // source, and a remote write's completion names it too: shm. rxm
                              // (tcp;ofi_rxm, verbs;ofi_rxm) writes remote-write completions
                              // without one (1.17: the entry's source is left as it was)
  bool contextMode = false;   // mode FI_CONTEXT/FI_CONTEXT2 (handled inside; for the record)
  std::string threading;      // "FI_THREAD_COMPLETION" ...
  uint64_t maxMsgSize = 0;    // ep_attr->max_msg_size: largest send, write or read
  uint64_t injectSize = 0;    // tx_attr->inject_size: largest inject
  uint64_t cqDataSize = 0;    // domain_attr->cq_data_size: bytes of immediate data (>= 4)
  uint64_t mrKeySize = 0;     // domain_attr->mr_key_size
  uint64_t txSize = 0;        // tx_attr->size: sends/writes/reads one endpoint may have posted
  uint64_t rxSize = 0;        // rx_attr->size: receives one endpoint may have posted
  uint64_t iovLimit = 0;      // tx_attr->iov_limit
  std::shared_ptr<fi_info> info;  // this NIC's fi_info (a copy), to open its domain

  // One line for an INFO log: provider, domain, speed, PCI, mr_mode, progress, sizes.
  std::string describe() const;
};

// Whether the NIC's endpoints work without CUDA calls inside libfabric: an endpoint (never
// enabled) accepts FI_OPT_CUDA_API_PERMITTED = false. Else false, with the provider's words.
bool ofiCudaApiOptional(const OfiNic& nic, std::string* why);

// Finds the NICs of one provider: FI_EP_RDM with FI_MSG | FI_RMA (read, write, remote read and
// write), remote CQ data of at least 4 bytes, mr_mode bits within FI_MR_LOCAL | VIRT_ADDR |
// ALLOCATED | PROV_KEY | ENDPOINT (| HMEM), FI_THREAD_COMPLETION, FI_AV_TABLE. One OfiNic per
// domain name, in libfabric's order. Empty with the reason when none qualifies. *progress says
// which progress model was obtained and why ("FI_PROGRESS_MANUAL (AUTO refused)").
std::vector<OfiNic> ofiDiscover(const OfiOptions& options, std::string* why, std::string* progress = nullptr);

// --- domains and memory ---

class OfiEndpoint;

// A NIC's fabric and domain, opened once per NIC per process and shared (open returns the same
// object while one is alive).
class OfiDomain {
 public:
  // shared false: a fabric and domain of the caller's own, never handed to another caller.
  static std::shared_ptr<OfiDomain> open(const OfiNic& nic, OfiError* err, bool shared = true);
  ~OfiDomain();
  OfiDomain(const OfiDomain&) = delete;
  OfiDomain& operator=(const OfiDomain&) = delete;
  const OfiNic& nic() const;
  struct Impl;  // native/ofi/ofi_internal.h
  Impl* impl() const { return impl_.get(); }

 private:
  explicit OfiDomain(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// kCudaIpc: CUDA memory registered with FI_HMEM_DEVICE_ONLY, which lets shm move it between
// processes by CUDA IPC (device to device) instead of copying it through host memory. A process
// cannot open its own IPC handles: such a region must not be the local side of an operation
// whose peer is this same process (TSNET_OFI_GPU_IPC, docs/ofi-facts.md).
enum class OfiMemType : uint8_t { kHost = 0, kCuda = 1, kCudaIpc = 2 };

// A region that is part of a DMA-BUF (NCCL's regMrDmaBuf): the file descriptor, and where the
// region starts within it. Registered with FI_MR_DMABUF, which needs libfabric API 1.20. The
// provider imports the DMA-BUF during the registration (verbs, EFA) or registers the virtual
// addresses (shm, tcp: libfabric's util layer ignores the fd); the caller may close the fd
// once reg returned.
struct OfiDmaBuf {
  int fd = -1;
  uint64_t offset = 0;
};

// A registered region. The remote side addresses byte p of it as remoteAddr(p) with key().
// Deregistering (the destructor) while operations on the region are in flight is allowed by
// libfabric but leaves those operations undefined: stop them first (docs/ofi-facts.md).
class OfiMr {
 public:
  // Registers [base, base + size) for local and remote read and write. kCuda: the GPU is found
  // from the pointer (cudaDeviceOf); needs nic().hmem. ep: the endpoint the region is bound to
  // when the NIC has FI_MR_ENDPOINT (then required), ignored otherwise.
  // dmabuf: register through the DMA-BUF (FI_MR_DMABUF) rather than by address.
  static std::unique_ptr<OfiMr> reg(const std::shared_ptr<OfiDomain>& domain, void* base, size_t size,
                                    OfiMemType type, OfiEndpoint* ep, OfiError* err,
                                    const OfiDmaBuf* dmabuf = nullptr);
  ~OfiMr();
  OfiMr(const OfiMr&) = delete;
  OfiMr& operator=(const OfiMr&) = delete;
  void* desc() const { return desc_; }  // pass with local buffers inside the region
  uint64_t key() const { return key_; }  // the remote key the peer passes to write and read
  // The address a peer passes as raddr to reach byte p: p itself with FI_MR_VIRT_ADDR, else
  // its offset from the region's first byte.
  uint64_t remoteAddr(const void* p) const;
  char* base() const { return base_; }
  size_t size() const { return size_; }
  int device() const { return device_; }  // GPU ordinal, -1 for host memory
  // kCudaIpc asked: whether the region got FI_HMEM_DEVICE_ONLY; when not, why (then it is a
  // plain kCuda registration: memory legacy CUDA IPC cannot export).
  bool ipc() const { return ipc_; }
  bool dmabuf() const { return dmabuf_; }  // registered through a DMA-BUF
  const std::string& ipcWhy() const { return ipcWhy_; }

 private:
  OfiMr() = default;
  std::shared_ptr<OfiDomain> domain_;
  void* mr_ = nullptr;  // struct fid_mr*
  void* desc_ = nullptr;
  uint64_t key_ = 0;
  char* base_ = nullptr;
  size_t size_ = 0;
  int device_ = -1;
  bool virtAddr_ = false;
  bool ipc_ = false;
  bool dmabuf_ = false;
  std::string ipcWhy_;
};

// --- endpoints ---

// What a completion completes.
enum class OfiOp : uint8_t {
  kSend = 1,         // send or sendData
  kRecv = 2,         // recv (flags has kOfiRemoteCqData when the sender sent immediate data)
  kWrite = 3,        // write or writeData
  kRead = 4,         // read
  kRemoteWrite = 5,  // a peer's writeData landed here: data holds the immediate data
};

// libfabric's completion flags, as they appear in OfiCompletion::flags (asserted in ofi.cc).
constexpr uint64_t kOfiFlagMsg = 1ULL << 1;           // FI_MSG
constexpr uint64_t kOfiFlagRma = 1ULL << 2;           // FI_RMA
constexpr uint64_t kOfiFlagRead = 1ULL << 8;          // FI_READ
constexpr uint64_t kOfiFlagWrite = 1ULL << 9;         // FI_WRITE
constexpr uint64_t kOfiFlagRecv = 1ULL << 10;         // FI_RECV
constexpr uint64_t kOfiFlagSend = 1ULL << 11;         // FI_SEND
constexpr uint64_t kOfiFlagRemoteRead = 1ULL << 12;   // FI_REMOTE_READ
constexpr uint64_t kOfiFlagRemoteWrite = 1ULL << 13;  // FI_REMOTE_WRITE
constexpr uint64_t kOfiFlagRemoteCqData = 1ULL << 17; // FI_REMOTE_CQ_DATA

struct OfiCompletion {
  uint64_t ctx = 0;    // the context the caller gave the operation; 0 for kRemoteWrite (or, with
                       // FI_RX_CQ_DATA, the context of the receive it consumed)
  uint64_t flags = 0;  // libfabric's flags (kOfiFlag*); error completions may carry none
  uint64_t len = 0;    // bytes received (kRecv); libfabric leaves it 0 for most other ops
  uint64_t data = 0;   // immediate data, valid when flags has kOfiFlagRemoteCqData
  uint64_t src = ~0ULL; // FI_SOURCE: the sender's fi_addr of a message or remote write; ~0
                       // (FI_ADDR_NOTAVAIL) when not in the address vector, not granted, or an error
  int status = 0;      // 0, or the negative libfabric error (-FI_ECANCELED, -FI_EIO, ...)
  int provErrno = 0;   // the provider's own error number, on error
  OfiOp op = OfiOp::kSend;
  std::string error;   // on error: libfabric's and the provider's words (fi_cq_strerror)
};

// fi_addr_t of "any peer" for recv.
constexpr uint64_t kOfiAnyPeer = ~0ULL;

// Returned by a post that could not be queued now (-FI_EAGAIN): nothing was posted; poll (which
// progresses the provider) and post again.
constexpr int kOfiAgain = -11;

struct OfiEndpointOptions {
  bool waitFd = false;            // ask for an fd to sleep on (FI_WAIT_FD); see waitFd()
  size_t cqSize = 0;              // completion queue entries; 0: tx size + rx size
  bool bell = false;              // no wait fd: a doorbell its peers ring while its thread sleeps (bellFd)
};

// An RDM endpoint with its own completion queue (FI_CQ_FORMAT_DATA) and address vector
// (FI_AV_TABLE). Posts return 0 (posted: exactly one completion will follow, except inject),
// kOfiAgain, or another negative error with lastError() saying why; they never block.
class OfiEndpoint {
 public:
  static std::unique_ptr<OfiEndpoint> open(const std::shared_ptr<OfiDomain>& domain, const OfiEndpointOptions& options,
                                           OfiError* err);
  ~OfiEndpoint();  // close() if not closed
  OfiEndpoint(const OfiEndpoint&) = delete;
  OfiEndpoint& operator=(const OfiEndpoint&) = delete;

  const std::shared_ptr<OfiDomain>& domain() const;
  // Region names shm refused at open as left by a killed process with this pid (each try takes
  // the next name; docs/ofi-facts.md).
  int shmNamesRefused() const;
  // This endpoint's address (fi_getname), to hand to peers.
  const std::string& name() const;
  // Makes a peer's address usable: *peer is what posts take (fi_av_insert).
  bool insertPeer(const void* name, size_t len, uint64_t* peer, OfiError* err);
  bool removePeer(uint64_t peer, OfiError* err);

  int recv(void* buf, size_t len, void* desc, uint64_t ctx, uint64_t peer = kOfiAnyPeer);
  int send(const void* buf, size_t len, void* desc, uint64_t peer, uint64_t ctx);
  int sendData(const void* buf, size_t len, void* desc, uint64_t imm, uint64_t peer, uint64_t ctx);
  // fi_sendmsg of count (<= 2) iovecs, each with its desc, with immediate data when withImm.
  int sendMsg(const iovec* iov, void** desc, size_t count, uint64_t imm, bool withImm, uint64_t peer,
              uint64_t ctx);
  // No completion: buf may be reused at once. len <= nic().injectSize.
  int inject(const void* buf, size_t len, uint64_t peer);
  int injectData(const void* buf, size_t len, uint64_t imm, uint64_t peer);
  // fi_inject_writedata: a write with immediate data and no completion on this side.
  int injectWriteData(const void* buf, size_t len, uint64_t imm, uint64_t peer, uint64_t raddr, uint64_t rkey);
  int write(const void* buf, size_t len, void* desc, uint64_t peer, uint64_t raddr, uint64_t rkey, uint64_t ctx);
  int writeData(const void* buf, size_t len, void* desc, uint64_t imm, uint64_t peer, uint64_t raddr, uint64_t rkey,
                uint64_t ctx);
  int read(void* buf, size_t len, void* desc, uint64_t peer, uint64_t raddr, uint64_t rkey, uint64_t ctx);
  // Why the last post or poll failed (not kOfiAgain).
  const OfiError& lastError() const;

  // Progresses the provider and takes up to max completions, errors included (each with its
  // status and words). Returns how many, or a negative error of the queue itself.
  int poll(OfiCompletion* out, int max);
  // Operations posted and not yet completed (inject excluded).
  size_t inFlight() const;

  // An fd that becomes readable when a completion may be waiting; -1 when the endpoint was
  // opened without waitFd or the provider offers none (then the thread must poll).
  int waitFd() const;
  // True when the thread may sleep on waitFd() now (fi_trywait: nothing to progress, nothing
  // queued); false: poll first.
  bool tryWait();

  // The doorbell of an endpoint without a wait fd (opened with bell; native/ofi/ofi_bell.cc):
  // a datagram socket that becomes readable when a peer rang, -1 where there is none. Its
  // owner's thread arms it (bellArm), polls once more, then sleeps on bellFd(); a peer of any
  // process that posts to this endpoint while it is armed disarms it and rings, once. bellDrain
  // reads what rang; bellDisarm stops the rings once the thread is awake.
  int bellFd() const;
  const std::string& bellWhy() const;  // why bellFd() is -1 where a bell was asked for
  void bellArm();
  void bellDisarm();
  void bellDrain();
  // Operations in flight that are not receives: their completions need this endpoint polled
  // after a peer's progress, which rings no bell (a send's, a write's, a read's).
  size_t outgoing() const;
  // Rings this endpoint's posts made (peers woken) and rings it heard (datagrams read).
  uint64_t bellRang() const;
  uint64_t bellHeard() const;

  // Cancels posted receives, closes the endpoint, then drains and discards its completion queue,
  // so nothing it did can surface later. Returns the contexts of the operations that never
  // completed (in post order); the caller fails them. Never blocks on the peer. After it
  // returns no buffer of these operations is used by this process's libfabric (for shm, see
  // docs/ofi-facts.md on reads a live peer may still serve).
  //
  // Exception: tcp;ofi_rxm can crash inside fi_close of an endpoint whose peer reset the
  // connection (docs/ofi-facts.md). Such an endpoint with no RMA read in flight (nothing that
  // writes into local memory) is left open instead, its receives cancelled and its queue
  // drained: a leak per dead peer rather than a fault in the host process (leftOpen()).
  std::vector<uint64_t> close();
  // close() left the endpoint open (above).
  bool leftOpen() const;

  struct Impl;  // native/ofi/ofi_internal.h
  Impl* impl() const { return impl_.get(); }

 private:
  explicit OfiEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tsn
