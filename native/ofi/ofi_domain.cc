// Domains (one per NIC per process, shared) and memory registration.
#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>

#include "ofi/cuda.h"
#include "ofi/ofi_internal.h"

namespace tsn {

#if TSN_HAVE_LIBFABRIC
namespace {

std::mutex domainsMu;
std::map<std::string, std::weak_ptr<OfiDomain>> domains;  // by OfiNic::identity

OfiError invalid(const std::string& text) { return ofiErrorOf(-FI_EINVAL, text); }

}  // namespace

OfiDomain::OfiDomain(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OfiDomain::~OfiDomain() {
  if (impl_->domain) fi_close(&impl_->domain->fid);
  if (impl_->fabric) fi_close(&impl_->fabric->fid);
}

const OfiNic& OfiDomain::nic() const { return impl_->nic; }

uint64_t OfiDomain::Impl::pickKey() {
  // 30 bits (fewer where the provider's keys are shorter): keys travel through the protocol's
  // JavaScript, where a number above 2^30 is a heap object each time a call that V8 did not
  // inline passes it (8 bytes of garbage per message when they were 64-bit).
  int bits = nic.mrKeySize == 0 || nic.mrKeySize >= 4 ? 30 : static_cast<int>(8 * nic.mrKeySize);
  uint64_t mask = (1ULL << bits) - 1;
  for (;;) {
    uint64_t x = (nextKey.fetch_add(1) * keyMul + keyAdd) & mask;  // each step a bijection of n bits
    x ^= x >> (bits / 2);
    x = (x * 0xD6E8FEB86659FD93ULL) & mask;
    if (x != FI_KEY_NOTAVAIL) return x;
  }
}

std::shared_ptr<OfiDomain> OfiDomain::open(const OfiNic& nic, OfiError* err, bool shared) {
  if (!ofiLoad(nullptr) || !nic.info) {
    *err = invalid("OfiDomain::open: libfabric is not loaded or the NIC did not come from ofiDiscover");
    return nullptr;
  }
  std::lock_guard<std::mutex> g(domainsMu);
  if (auto live = shared ? domains[nic.identity].lock() : nullptr) return live;
  auto impl = std::make_unique<Impl>();
  impl->nic = nic;
  uint64_t seed[2] = {0, 0};
  if (getrandom(seed, sizeof seed, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof seed)) {
    seed[0] = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ULL;
    seed[1] = reinterpret_cast<uintptr_t>(impl.get()) ^ (static_cast<uint64_t>(getpid()) << 32);
  }
  impl->keyMul = seed[0] | 1;  // odd: multiplying is a bijection modulo 2^n
  impl->keyAdd = seed[1];
  OfiSignalGuard guard;
  int rc = ofiLib().fabric(nic.info->fabric_attr, &impl->fabric, nullptr);
  if (rc != 0) {
    *err = ofiErrorOf(rc, "fi_fabric " + nic.fabric, nic.provider);
    return nullptr;
  }
  rc = fi_domain(impl->fabric, nic.info.get(), &impl->domain, nullptr);
  if (rc != 0) {
    *err = ofiErrorOf(rc, "fi_domain " + nic.domain, nic.provider);
    fi_close(&impl->fabric->fid);
    return nullptr;
  }
  std::shared_ptr<OfiDomain> d(new OfiDomain(std::move(impl)));
  if (shared) domains[nic.identity] = d;
  return d;
}

// OfiMrAttr keeps the offsets of the fields the headers' fi_mr_attr has.
#define TSN_SAME_OFFSET(f) static_assert(offsetof(OfiMrAttr, f) == offsetof(fi_mr_attr, f), "fi_mr_attr." #f)
TSN_SAME_OFFSET(mr_iov);
TSN_SAME_OFFSET(iov_count);
TSN_SAME_OFFSET(access);
TSN_SAME_OFFSET(offset);
TSN_SAME_OFFSET(requested_key);
TSN_SAME_OFFSET(context);
TSN_SAME_OFFSET(auth_key_size);
TSN_SAME_OFFSET(auth_key);
TSN_SAME_OFFSET(iface);
TSN_SAME_OFFSET(device);
#undef TSN_SAME_OFFSET
static_assert(sizeof(OfiMrAttr) >= sizeof(fi_mr_attr), "fi_mr_attr");

int ofiMrRegattr(fid_domain* domain, const OfiMrAttr& attr, uint64_t flags, fid_mr** mr) {
  // libfabric reads the fields of the API asked for (ofi_internal.h, kOfiMaxApi).
  return fi_mr_regattr(domain, reinterpret_cast<const fi_mr_attr*>(&attr), flags, mr);
}

std::unique_ptr<OfiMr> OfiMr::reg(const std::shared_ptr<OfiDomain>& domain, void* base, size_t size, OfiMemType type,
                                  OfiEndpoint* ep, OfiError* err, const OfiDmaBuf* dmabuf) {
  OfiDomain::Impl* d = domain ? domain->impl() : nullptr;
  if (!d) {
    *err = invalid("OfiMr::reg: no domain");
    return nullptr;
  }
  const OfiNic& nic = d->nic;
  if (!base && size) {
    *err = invalid("OfiMr::reg: a null buffer");
    return nullptr;
  }
  if (nic.mrEndpoint && !ep) {
    *err = invalid("OfiMr::reg: " + nic.provider + " registers memory per endpoint (FI_MR_ENDPOINT): pass the endpoint");
    return nullptr;
  }
  if (dmabuf && ofiLib().api < kOfiDmaBufApi) {
    *err = invalid("OfiMr::reg: DMA-BUF registration needs libfabric API 1.20 or newer; this is " + ofiVersionText());
    return nullptr;
  }
  // libfabric's util layer (1.22; tcp, and shm were it to drop FI_MR_VIRT_ADDR) takes the base of
  // an offset-addressed region from attr->mr_iov even when that field holds the fi_mr_dmabuf:
  // writes then land an fd's worth of bytes off (seen with tcp;ofi_rxm, docs/ofi-facts.md).
  if (dmabuf && !nic.virtAddr) {
    *err = invalid("OfiMr::reg: DMA-BUF registration on " + nic.provider +
                   ", whose remote addresses are offsets (no FI_MR_VIRT_ADDR): libfabric misplaces such regions");
    return nullptr;
  }
  if (dmabuf && (dmabuf->fd < 0 || dmabuf->offset > reinterpret_cast<uintptr_t>(base))) {
    *err = invalid("OfiMr::reg: DMA-BUF fd " + std::to_string(dmabuf->fd) + " with offset " + std::to_string(dmabuf->offset) +
                   " for a region at " + std::to_string(reinterpret_cast<uintptr_t>(base)) +
                   ": needs an fd and an offset no larger than the address");
    return nullptr;
  }
  int device = -1;
  bool cuda = type != OfiMemType::kHost;
  if (cuda) {
    if (!nic.hmem) {
      *err = invalid("OfiMr::reg: GPU memory on " + nic.provider + " " + nic.domain + ", which takes host memory only" +
                     (nic.hmemWhy.empty() ? "" : " (" + nic.hmemWhy + ")"));
      return nullptr;
    }
    std::string why;
    if (!cudaDeviceOf(base, &device, &why)) {
      *err = ofiErrorOf(-FI_ENODEV, "OfiMr::reg: cannot tell which GPU owns the buffer", why);
      return nullptr;
    }
    if (device < 0) {
      *err = invalid("OfiMr::reg: the buffer was registered as GPU memory but CUDA says it is host memory");
      return nullptr;
    }
  }
  // libfabric's shm exports a FI_HMEM_DEVICE_ONLY region with cudaIpcGetMemHandle, which fails
  // on cuMem* allocations (it then falls back, without a word, to its copy through host memory).
  std::string ipcWhy;
  if (type == OfiMemType::kCudaIpc) {
    std::string why;
    int capable = cudaLegacyIpcCapable(base, &why);
    if (capable != 1) {
      ipcWhy = capable == 0 ? "a cuMem* allocation, not cudaMalloc; NCCL_CUMEM_ENABLE=0 makes NCCL use cudaMalloc" : why;
      type = OfiMemType::kCuda;
    }
  }
  iovec iov{base, size};
  // A DMA-BUF region: the fd's bytes [offset, offset + size), mapped at base, so the DMA-BUF's
  // first byte is at base - offset (fi_mr(3), FI_MR_DMABUF).
  OfiMrDmaBuf buf{};
  OfiMrAttr attr{};
  if (dmabuf) {
    buf.fd = dmabuf->fd;
    buf.offset = dmabuf->offset;
    buf.len = size;
    buf.base_addr = static_cast<char*>(base) - dmabuf->offset;
    attr.dmabuf = &buf;
  } else {
    attr.mr_iov = &iov;
  }
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  attr.requested_key = nic.provKey ? 0 : d->pickKey();
  attr.iface = cuda ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
  if (cuda) attr.device.cuda = device;
  uint64_t flags = (type == OfiMemType::kCudaIpc ? FI_HMEM_DEVICE_ONLY : 0) | (dmabuf ? kOfiMrDmaBuf : 0);
  fid_mr* mr = nullptr;
  int rc = ofiMrRegattr(d->domain, attr, flags, &mr);
  if (rc != 0) {
    *err = ofiErrorOf(rc, std::string("fi_mr_regattr") + (dmabuf ? " (FI_MR_DMABUF, fd " + std::to_string(dmabuf->fd) + ")" : "") +
                              " of " + std::to_string(size) + " bytes of " +
                              (cuda ? "GPU " + std::to_string(device) : std::string("host")) + " memory",
                      nic.provider);
    return nullptr;
  }
  if (nic.mrEndpoint) {
    OfiEndpoint::Impl* e = ep->impl();
    rc = e && e->ep ? fi_mr_bind(mr, &e->ep->fid, 0) : -FI_EINVAL;
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      *err = ofiErrorOf(rc, "fi_mr_bind/fi_mr_enable to the endpoint (FI_MR_ENDPOINT)", nic.provider);
      fi_close(&mr->fid);
      return nullptr;
    }
  }
  std::unique_ptr<OfiMr> r(new OfiMr());
  r->ipc_ = type == OfiMemType::kCudaIpc;
  r->dmabuf_ = dmabuf != nullptr;
  r->ipcWhy_ = ipcWhy;
  r->domain_ = domain;
  r->mr_ = mr;
  r->desc_ = fi_mr_desc(mr);
  r->key_ = fi_mr_key(mr);
  r->base_ = static_cast<char*>(base);
  r->size_ = size;
  r->device_ = device;
  r->virtAddr_ = nic.virtAddr;
  if (r->key_ == FI_KEY_NOTAVAIL) {
    *err = ofiErrorOf(-FI_ENOKEY, "fi_mr_key", nic.provider + " has no 64-bit key for the region");
    return nullptr;  // the destructor closes the region
  }
  return r;
}

OfiMr::~OfiMr() {
  if (mr_) fi_close(&static_cast<fid_mr*>(mr_)->fid);
}

// CUDA support is a build option of libfabric (Debian's and Ubuntu's 1.17 have none, though shm
// still grants FI_HMEM). Registration checks the memory interface before it looks at the buffer,
// so a host page offered as CUDA memory answers -FI_ENOSYS exactly when that support is missing.
bool ofiCudaRegistrable(const OfiNic& nic, std::string* why) {
  OfiError err;
  std::shared_ptr<OfiDomain> d = OfiDomain::open(nic, &err);
  if (!d) {
    *why = err.text;
    return false;
  }
  std::unique_ptr<char, void (*)(void*)> page(static_cast<char*>(aligned_alloc(4096, 4096)), free);
  iovec iov{page.get(), 4096};
  OfiMrAttr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_REMOTE_READ | FI_REMOTE_WRITE;
  attr.requested_key = nic.provKey ? 0 : d->impl()->pickKey();
  attr.iface = FI_HMEM_CUDA;
  attr.device.cuda = 0;
  fid_mr* mr = nullptr;
  int rc = ofiMrRegattr(d->impl()->domain, attr, 0, &mr);
  if (rc == 0) fi_close(&mr->fid);
  if (rc != -FI_ENOSYS) return true;  // the interface is there; the page is just not GPU memory
  *why = "this libfabric has no CUDA support (fi_mr_regattr with FI_HMEM_CUDA: " + ofiStrerror(rc) +
         "); set TSNET_LIBFABRIC to a libfabric built with CUDA";
  return false;
}

uint64_t OfiMr::remoteAddr(const void* p) const {
  return virtAddr_ ? reinterpret_cast<uintptr_t>(p) : static_cast<uint64_t>(static_cast<const char*>(p) - base_);
}

#else

struct OfiDomain::Impl {
  OfiNic nic;
};
OfiDomain::OfiDomain(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OfiDomain::~OfiDomain() = default;
const OfiNic& OfiDomain::nic() const { return impl_->nic; }
std::shared_ptr<OfiDomain> OfiDomain::open(const OfiNic&, OfiError* err, bool) {
  ofiLoad(&err->text);
  err->code = -38;  // ENOSYS
  err->result = ofiResultOf(err->code);
  return nullptr;
}
std::unique_ptr<OfiMr> OfiMr::reg(const std::shared_ptr<OfiDomain>&, void*, size_t, OfiMemType, OfiEndpoint*,
                                  OfiError* err, const OfiDmaBuf*) {
  ofiLoad(&err->text);
  err->code = -38;
  err->result = ofiResultOf(err->code);
  return nullptr;
}
OfiMr::~OfiMr() = default;
uint64_t OfiMr::remoteAddr(const void* p) const {
  return virtAddr_ ? reinterpret_cast<uintptr_t>(p) : static_cast<uint64_t>(static_cast<const char*>(p) - base_);
}

#endif

}  // namespace tsn
