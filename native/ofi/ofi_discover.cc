// Finding the NICs: fi_getinfo with the hints the RDMA protocol needs, the provider choice,
// the progress model (AUTO asked, MANUAL taken), FI_HMEM for GPU memory, and each NIC's
// properties (docs/ofi-facts.md shows what tcp and shm answer).
#include <limits.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ofi/cuda.h"
#include "ofi/ofi_internal.h"

namespace tsn {

#if TSN_HAVE_LIBFABRIC
namespace {

// mr_mode bits this layer honours: it registers every buffer it uses (LOCAL), computes remote
// addresses both ways (VIRT_ADDR), registers only allocated memory (ALLOCATED), reads the key
// back (PROV_KEY), binds regions to an endpoint when asked (ENDPOINT) and registers GPU buffers
// (HMEM). Not RAW keys (keys are 64-bit here), MMU_NOTIFY or RMA_EVENT.
constexpr uint64_t kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

// The fi_info list of one fi_getinfo, freed with it, and the entries kept from it.
struct Infos {
  fi_info* head = nullptr;
  std::vector<fi_info*> kept;
  Infos() = default;
  Infos(const Infos&) = delete;
  Infos& operator=(const Infos&) = delete;
  ~Infos() {
    if (head) ofiLib().freeinfo(head);
  }
};

// shm refuses to start (fi_getinfo finds nothing) when /dev/shm has too little free space for
// its regions, which a container's default /dev/shm (64 MiB) soon is. Where shm was asked for,
// the refusal names the space, so that the WARN does not read as a missing provider.
std::string devShmNote(const std::string& provider) {
  const char* env = getenv("FI_PROVIDER");
  if (provider.find("shm") == std::string::npos && !(env && strstr(env, "shm"))) return "";
  struct statvfs st;
  if (statvfs("/dev/shm", &st) != 0) return "; shm needs /dev/shm, which cannot be read (" + std::string(strerror(errno)) + ")";
  auto mib = [](unsigned long long b) { return std::to_string(b >> 20); };
  const unsigned long long unit = st.f_frsize ? st.f_frsize : st.f_bsize;
  return "; /dev/shm has " + mib(static_cast<unsigned long long>(st.f_bavail) * unit) + " MiB free of " +
         mib(static_cast<unsigned long long>(st.f_blocks) * unit) +
         " MiB, and shm refuses to start when its regions would not fit (FI_LOG_LEVEL=warn shows libfabric's reason)";
}

bool inList(const std::string& name, const std::string& list) {
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty() && item == name) return true;
  return false;
}

// "tcp" matches "tcp;ofi_rxm"; a full layered name matches itself.
bool providerMatches(const char* prov, const std::string& want) {
  if (want.empty()) return true;
  std::string p = prov ? prov : "";
  if (p == want) return true;
  return p.compare(0, p.find(';'), want) == 0 && want.find(';') == std::string::npos;
}

bool ipFormat(uint32_t f) { return f == FI_SOCKADDR_IN || f == FI_SOCKADDR_IN6; }

// Runs fi_getinfo with the protocol's hints and keeps what qualifies. provider: "" for any.
void query(Infos* out, const OfiOptions& o, const std::string& provider, bool hmem, fi_progress progress, int* rc,
           bool source = false) {
  const OfiLib& f = ofiLib();
  fi_info* hints = f.dupinfo(nullptr);  // fi_allocinfo
  if (!hints) {
    *rc = -FI_ENOMEM;
    return;
  }
  hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0) |
               (source ? FI_SOURCE : 0);
  // Every operation carries an OfiPending whose first bytes are a fi_context2.
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | (o.rxCqData ? FI_RX_CQ_DATA : 0);
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(kMrModes | (hmem ? FI_MR_HMEM : 0));
  hints->domain_attr->threading = FI_THREAD_COMPLETION;
  hints->domain_attr->control_progress = progress;
  hints->domain_attr->data_progress = progress;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->cq_data_size = 4;
  {
    OfiSignalGuard guard;  // providers initialise at their first fi_getinfo
    *rc = f.getinfo(f.api, nullptr, nullptr, 0, hints, &out->head);
  }
  f.freeinfo(hints);
  if (*rc != 0) return;
  for (fi_info* i = out->head; i; i = i->next) {
    const char* prov = i->fabric_attr ? i->fabric_attr->prov_name : nullptr;
    if (!prov || !i->domain_attr || !i->domain_attr->name || !i->ep_attr || !i->tx_attr || !i->rx_attr) continue;
    if (!providerMatches(prov, provider)) continue;
    if (i->domain_attr->cq_data_size < 4) continue;               // the protocol's 32-bit immediate
    if (i->domain_attr->mr_mode & ~(kMrModes | FI_MR_HMEM)) continue;  // a mode bit we cannot honour
    if (i->domain_attr->mr_key_size > 8) continue;                // keys travel as 64 bits
    if (i->mode & ~(FI_CONTEXT | FI_CONTEXT2 | (o.rxCqData ? FI_RX_CQ_DATA : 0))) continue;
    if (ipFormat(i->addr_format)) {  // an IP provider: one domain per interface
      if (inList(i->domain_attr->name, o.excludeIf)) continue;
      if (i->addr_format == FI_SOCKADDR_IN6 && !o.ipv6) continue;
    }
    out->kept.push_back(i);
  }
}

const char* threadingName(fi_threading t) {
  switch (t) {
    case FI_THREAD_SAFE: return "FI_THREAD_SAFE";
    case FI_THREAD_FID: return "FI_THREAD_FID";
    case FI_THREAD_ENDPOINT: return "FI_THREAD_ENDPOINT";
    case FI_THREAD_COMPLETION: return "FI_THREAD_COMPLETION";
    case FI_THREAD_DOMAIN: return "FI_THREAD_DOMAIN";
    default: return "FI_THREAD_UNSPEC";
  }
}

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

bool isPciAddress(const std::string& s) {
  unsigned d, b, dev, fn;
  char tail;
  return sscanf(s.c_str(), "%x:%x:%x.%x%c", &d, &b, &dev, &fn, &tail) == 4;
}

// The sysfs directory of the PCI device at or above path (a realpath), "" if none.
std::string pciAncestor(const std::string& path) {
  std::string p = path;
  while (!p.empty() && p != "/") {
    size_t slash = p.rfind('/');
    std::string base = p.substr(slash + 1);
    if (isPciAddress(base)) return p;
    p = p.substr(0, slash);
  }
  return "";
}

std::string realPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? buf : "";
}

// Link speed and PCI device: from fi_info's NIC attributes when the provider fills them, else,
// for an IP provider whose domain is a network interface, from sysfs.
void fillHardware(OfiNic* n, const fi_info* i) {
  fid_nic* nic = i->nic;
  if (nic && nic->link_attr && nic->link_attr->speed > 0)
    n->speedMbps = static_cast<int>(nic->link_attr->speed / 1000000);
  if (nic && nic->bus_attr && nic->bus_attr->bus_type == FI_BUS_PCI) {
    const fi_pci_attr& a = nic->bus_attr->attr.pci;
    char bdf[32];
    snprintf(bdf, sizeof bdf, "%04x:%02x:%02x.%x", a.domain_id, a.bus_id, a.device_id, a.function_id);
    n->pciPath = realPath(std::string("/sys/bus/pci/devices/") + bdf);
  }
  if (!ipFormat(i->addr_format)) return;
  std::string sys = "/sys/class/net/" + n->domain;
  if (n->speedMbps <= 0) {
    int s = atoi(readLine(sys + "/speed").c_str());  // -1 or unreadable for virtual links
    if (s > 0) n->speedMbps = s;
  }
  if (n->pciPath.empty()) n->pciPath = pciAncestor(realPath(sys + "/device"));
}

OfiNic nicOf(const fi_info* i, bool hmemAsked) {
  const OfiLib& f = ofiLib();
  OfiNic n;
  n.provider = i->fabric_attr->prov_name;
  n.fabric = i->fabric_attr->name ? i->fabric_attr->name : "";
  n.domain = i->domain_attr->name;
  fillHardware(&n, i);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  std::string where = n.pciPath.empty() ? n.fabric : n.pciPath.substr(n.pciPath.rfind('/') + 1);
  n.identity = n.provider + "/" + n.domain + "/" + where + "/" + host;
  n.guid = fnv1a(n.identity);
  n.mrMode = static_cast<uint64_t>(i->domain_attr->mr_mode);
  n.virtAddr = n.mrMode & FI_MR_VIRT_ADDR;
  n.provKey = n.mrMode & FI_MR_PROV_KEY;
  n.mrLocal = n.mrMode & FI_MR_LOCAL;
  n.mrEndpoint = n.mrMode & FI_MR_ENDPOINT;
  n.hmem = (i->caps & FI_HMEM) != 0;
  if (hmemAsked && !n.hmem) n.hmemWhy = n.provider + " does not offer FI_HMEM";
  n.mixedIov = f.runtime >= FI_VERSION(1, 18);
  // shm keeps its cache of peers' CUDA IPC mappings per domain, keyed by the peer's number in
  // the receiving endpoint's own table, so two endpoints of one domain mistake their peers 0 for
  // each other: the cache then closes a mapping while a transfer is under way, and
  // cudaIpcCloseMemHandle waited there for good (4 ranks, AllToAll; docs/ofi-facts.md). Each
  // shm endpoint gets a domain of its own.
  n.domainPerEndpoint = n.provider == "shm";
  n.autoProgress = i->domain_attr->data_progress == FI_PROGRESS_AUTO;
  n.rxCqData = (i->mode & FI_RX_CQ_DATA) != 0;
  n.source = (i->caps & FI_SOURCE) != 0;
  n.sourceWrites = n.source && n.provider.compare(0, 3, "shm") == 0;
  n.contextMode = (i->mode & (FI_CONTEXT | FI_CONTEXT2)) != 0;
  n.threading = threadingName(i->domain_attr->threading);
  n.maxMsgSize = i->ep_attr->max_msg_size;
  n.injectSize = i->tx_attr->inject_size;
  n.cqDataSize = i->domain_attr->cq_data_size;
  n.mrKeySize = i->domain_attr->mr_key_size;
  n.txSize = i->tx_attr->size;
  n.rxSize = i->rx_attr->size;
  n.iovLimit = i->tx_attr->iov_limit;
  fi_info* copy = f.dupinfo(i);  // one entry: next is not copied
  n.info = std::shared_ptr<fi_info>(copy, [](fi_info* p) {
    if (p) ofiLib().freeinfo(p);
  });
  return n;
}

std::string mrModeText(uint64_t m) {
  static const struct {
    uint64_t bit;
    const char* name;
  } bits[] = {{FI_MR_LOCAL, "LOCAL"},       {FI_MR_RAW, "RAW"},           {FI_MR_VIRT_ADDR, "VIRT_ADDR"},
              {FI_MR_ALLOCATED, "ALLOCATED"}, {FI_MR_PROV_KEY, "PROV_KEY"}, {FI_MR_MMU_NOTIFY, "MMU_NOTIFY"},
              {FI_MR_RMA_EVENT, "RMA_EVENT"}, {FI_MR_ENDPOINT, "ENDPOINT"}, {FI_MR_HMEM, "HMEM"}};
  std::string s;
  for (auto& b : bits)
    if (m & b.bit) s += std::string(s.empty() ? "" : "|") + b.name;
  return s.empty() ? "none" : s;
}

// What DMA-BUF registration of GPU memory needs besides FI_HMEM: libfabric's FI_MR_DMABUF
// (API 1.20), a kernel that imports DMA-BUFs into RDMA devices (5.12; neither NCCL nor
// libfabric checks it, and registrations fail without it), and GPUs that export them.
bool dmaBufViable(std::string* why) {
  const OfiLib& f = ofiLib();
  if (f.api < kOfiDmaBufApi) {
    *why = "FI_MR_DMABUF needs libfabric 1.20 or newer; this is " + ofiVersionText();
    return false;
  }
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &major, &minor) != 2) {
    *why = "the kernel's version is unknown (uname)";
    return false;
  }
  if (major < 5 || (major == 5 && minor < 12)) {
    *why = std::string("kernel ") + u.release + " cannot import DMA-BUFs into RDMA devices (5.12 or newer can)";
    return false;
  }
  return cudaDmaBufSupported(why);
}

std::string sizeText(uint64_t v) { return v == UINT64_MAX ? "unlimited" : std::to_string(v); }

}  // namespace

std::string OfiNic::describe() const {
  std::string s = provider + " domain " + domain + " fabric " + fabric + ", " +
                  (speedMbps > 0 ? std::to_string(speedMbps) + " Mbps" : "speed unknown") + ", PCI " +
                  (pciPath.empty() ? "unknown" : pciPath.substr(pciPath.rfind('/') + 1)) + ", mr_mode " +
                  mrModeText(mrMode) + ", data progress " + (autoProgress ? "AUTO" : "MANUAL") + ", " + threading +
                  ", inject " + std::to_string(injectSize) + " B, max message " + sizeText(maxMsgSize) +
                  " B, cq data " + std::to_string(cqDataSize) + " B, tx/rx queue " + std::to_string(txSize) + "/" +
                  std::to_string(rxSize) + ", GPU memory " + (hmem ? "yes" : "no");
  if (!hmem && !hmemWhy.empty()) s += " (" + hmemWhy + ")";
  if (hmem) s += noCudaApi ? " (no CUDA calls inside libfabric)" : " (libfabric calls CUDA on tsnet's threads)";
  if (hmem) s += std::string(", DMA-BUF ") + (dmabuf ? "yes" : "no") + (!dmabuf && !dmabufWhy.empty() ? " (" + dmabufWhy + ")" : "");
  if (hmem && !mixedIov) s += " (a send may not gather host and GPU memory: libfabric < 1.18)";
  if (rxCqData) s += ", remote CQ data consumes receives (FI_RX_CQ_DATA)";
  s += !source        ? ", senders not checked (no FI_SOURCE)"
       : sourceWrites ? ", senders checked (FI_SOURCE)"
                      : ", senders of messages checked (FI_SOURCE), of remote writes not (" + provider + " names none)";
  if (domainPerEndpoint) s += ", a domain per endpoint";
  return s;
}

std::vector<OfiNic> ofiDiscover(const OfiOptions& o, std::string* why, std::string* progressOut) {
  std::vector<OfiNic> nics;
  std::string reason;
  if (!ofiLoad(&reason)) {
    if (why) *why = reason;
    return nics;
  }
  // 1. The provider: the first that qualifies, whatever its progress model (MANUAL hints accept
  //    AUTO providers too) and without FI_HMEM (which shm alone answers, and must not pull the
  //    choice away from a network provider).
  std::string provider;
  {
    Infos all;
    int rc = 0;
    query(&all, o, o.provider, false, FI_PROGRESS_MANUAL, &rc);
    if (all.kept.empty()) {
      if (why) {
        *why = "no libfabric provider offers FI_EP_RDM with FI_MSG | FI_RMA, 4 bytes of remote CQ data and the "
               "memory registration modes this transport handles";
        if (!o.provider.empty()) *why += " among \"" + o.provider + "\"";
        if (rc != 0) *why += " (fi_getinfo: " + ofiStrerror(rc) + ")";
        *why += devShmNote(o.provider);
      }
      return nics;
    }
    provider = all.kept[0]->fabric_attr->prov_name;
  }
  // 2. That provider's NICs, with FI_HMEM when asked, FI_PROGRESS_AUTO when offered, and
  //    FI_SOURCE when offered (the protocol then checks who sent what names a comm).
  struct Try {
    bool hmem;
    fi_progress progress;
    bool source;
  };
  std::vector<Try> tries;
  for (bool h : {true, false}) {
    if (h && !o.hmem) continue;
    for (fi_progress p : {FI_PROGRESS_AUTO, FI_PROGRESS_MANUAL}) {
      if (p == FI_PROGRESS_AUTO && !o.autoProgress) continue;
      if (o.source) tries.push_back({h, p, true});
      tries.push_back({h, p, false});
    }
  }
  std::string hmemWhy;  // why GPU memory was asked for and not granted
  for (const Try& t : tries) {
    if (t.hmem && !hmemWhy.empty()) continue;  // no CUDA here: no progress model changes that
    Infos got;
    int rc = 0;
    query(&got, o, provider, t.hmem, t.progress, &rc, t.source);
    std::vector<std::string> seen;  // one NIC per domain name (tcp lists each interface several times)
    for (fi_info* i : got.kept) {
      if (strcmp(i->fabric_attr->prov_name, provider.c_str()) != 0) continue;
      std::string dom = i->domain_attr->name;
      bool dup = false;
      for (auto& s : seen) dup = dup || s == dom;
      if (dup) continue;
      seen.push_back(dom);
      nics.push_back(nicOf(i, o.hmem));
    }
    if (nics.empty()) continue;
    // GPU memory also needs the CUDA driver here, and a libfabric built with CUDA support, which
    // only a registration reveals. Without them, take the host-memory answer: FI_HMEM costs
    // (shm's inject size drops from 4096 to 0).
    if (t.hmem && (!cudaLoad(&hmemWhy) || !ofiCudaRegistrable(nics[0], &hmemWhy))) {
      nics.clear();
      continue;
    }
    // Under NCCL a plugin's threads must not call CUDA: a call that waits on a CUDA lock held by
    // a host thread that waits for a kernel that waits for this data never returns (fabric(7),
    // "CUDA deadlock"; docs/ofi-facts.md). GPU memory then only where libfabric promises not to.
    if (t.hmem) {
      std::string words;
      bool optional = ofiCudaApiOptional(nics[0], &words);
      if (!optional && !o.cudaApi) {
        hmemWhy = provider + " calls CUDA inside libfabric on tsnet's threads (" + words +
                  "), which can deadlock with the application's CUDA calls; TSNET_OFI_CUDA_API=1 registers GPU "
                  "memory anyway";
        nics.clear();
        continue;
      }
      for (OfiNic& n : nics) n.noCudaApi = optional;  // never permitted where not needed
      if (o.dmabuf) {
        std::string dmabufWhy;
        bool dmabuf = dmaBufViable(&dmabufWhy);
        for (OfiNic& n : nics) {
          n.dmabuf = dmabuf && n.virtAddr;
          n.dmabufWhy = !dmabuf ? dmabufWhy
                        : !n.virtAddr ? n.provider + "'s remote addresses are offsets (no FI_MR_VIRT_ADDR), and libfabric misplaces DMA-BUF regions addressed so"
                                      : "";
        }
      }
    }
    if (progressOut) {
      *progressOut = nics[0].autoProgress ? "FI_PROGRESS_AUTO" : "FI_PROGRESS_MANUAL";
      if (!nics[0].autoProgress && o.autoProgress) *progressOut += " (" + provider + " refused FI_PROGRESS_AUTO)";
    }
    break;
  }
  if (nics.empty()) {
    if (why) *why = provider + " answered once and then offered no NIC";
    return nics;
  }
  if (!hmemWhy.empty())
    for (OfiNic& n : nics) n.hmemWhy = hmemWhy;
  return nics;
}

#else

std::string OfiNic::describe() const { return provider + " " + domain; }

std::vector<OfiNic> ofiDiscover(const OfiOptions&, std::string* why, std::string*) {
  ofiLoad(why);
  return {};
}

#endif

}  // namespace tsn
