// Opening libfabric at run time, and the one table from libfabric errors to NCCL result codes.
#include "ofi/ofi_internal.h"

#include <dlfcn.h>
#include <errno.h>

#include <cstdlib>
#include <mutex>

#include "generated/tsnet_abi.h"

namespace tsn {

int ofiResultOf(int code) {
  if (code == 0) return TSN_SUCCESS;
  switch (code < 0 ? -code : code) {
    // The peer went away or cannot be reached.
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENOTCONN:
    case ESHUTDOWN:
    case EPIPE:
    case ETIMEDOUT:
    case EREMOTEIO:
      return TSN_REMOTE_ERROR;
    // Bad input: an argument, a size, a key or an operation the endpoint does not offer.
    case EINVAL:
    case EMSGSIZE:
    case EACCES:
    case EOPNOTSUPP:
    case ENOSYS:
    case 260:  // FI_EBADFLAGS
    case 266:  // FI_ENOKEY
    case EKEYREJECTED:
      return TSN_INVALID_ARGUMENT;
    // A message larger than the receive that took it.
    case 265:  // FI_ETRUNC
      return TSN_INVALID_USAGE;
    default:
      return TSN_SYSTEM_ERROR;
  }
}

#if TSN_HAVE_LIBFABRIC
static_assert(FI_EBADFLAGS == 260 && FI_ENOKEY == 266 && FI_ETRUNC == 265, "libfabric's error numbers");
static_assert(FI_EAGAIN == -kOfiAgain, "kOfiAgain is -FI_EAGAIN");

namespace {

// The oldest API whose structures and calls this layer uses: FI_HMEM, fi_mr_attr.iface/device.
constexpr uint32_t kMinApi = FI_VERSION(1, 10);

struct Loaded {
  OfiLib lib;
  bool ok = false;
  std::string why;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

template <class T>
bool resolve(void* h, const char* name, T* out, std::string* missing) {
  *out = reinterpret_cast<T>(dlsym(h, name));
  if (!*out) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *out != nullptr;
}

void load() {
  Loaded& l = loaded();
  const char* env = getenv("TSNET_LIBFABRIC");
  std::string path = env && *env ? env : "libfabric.so.1";
  void* h;
  {
    OfiSignalGuard guard;  // library constructors (libpsm_infinipath) take the host's signals
    h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!h) {
    const char* e = dlerror();
    l.why = "cannot open " + path + (env && *env ? " (TSNET_LIBFABRIC)" : "") + ": " + (e ? e : "dlopen failed") +
            "; install libfabric (libfabric1) or point TSNET_LIBFABRIC at it";
    return;
  }
  std::string missing;
  OfiLib& f = l.lib;
  resolve(h, "fi_getinfo", &f.getinfo, &missing);
  resolve(h, "fi_freeinfo", &f.freeinfo, &missing);
  resolve(h, "fi_dupinfo", &f.dupinfo, &missing);
  resolve(h, "fi_fabric", &f.fabric, &missing);
  resolve(h, "fi_strerror", &f.strerror, &missing);
  resolve(h, "fi_version", &f.version, &missing);
  if (!missing.empty()) {
    l.why = path + " lacks " + missing + ": not a usable libfabric";
    dlclose(h);
    return;
  }
  {
    OfiSignalGuard guard;
    f.runtime = f.version();
  }
  if (f.runtime < kMinApi) {
    l.why = path + " is libfabric " + std::to_string(FI_MAJOR(f.runtime)) + "." + std::to_string(FI_MINOR(f.runtime)) +
            "; the ofi transport needs 1.10 or newer";
    dlclose(h);
    return;
  }
  // Ask for the library's own API, up to the newest whose structures this layer lays out
  // (kOfiMaxApi; native/ofi/ofi_internal.h mirrors the ones newer than older headers have).
  f.api = f.runtime < kOfiMaxApi ? f.runtime : kOfiMaxApi;
  l.ok = true;  // the handle stays open for the life of the process
}

}  // namespace

const OfiLib& ofiLib() { return loaded().lib; }

bool ofiLoad(std::string* why) {
  static std::once_flag once;
  std::call_once(once, load);
  if (!loaded().ok && why) *why = loaded().why;
  return loaded().ok;
}

uint32_t ofiVersion() { return loaded().ok ? loaded().lib.runtime : 0; }
uint32_t ofiApiVersion() { return loaded().ok ? loaded().lib.api : 0; }

std::string ofiVersionText() {
  if (!loaded().ok) return "libfabric not loaded";
  const OfiLib& f = loaded().lib;
  return "libfabric " + std::to_string(FI_MAJOR(f.runtime)) + "." + std::to_string(FI_MINOR(f.runtime)) + " (API " +
         std::to_string(FI_MAJOR(f.api)) + "." + std::to_string(FI_MINOR(f.api)) + ")";
}

std::string ofiStrerror(int code) {
  if (!loaded().ok) return "libfabric not loaded (error " + std::to_string(code) + ")";
  const char* s = loaded().lib.strerror(code < 0 ? -code : code);
  return s ? s : "error " + std::to_string(code);
}

OfiError ofiErrorOf(int code, const std::string& what, const std::string& detail) {
  OfiError e;
  e.code = code > 0 ? -code : code;
  e.result = ofiResultOf(e.code);
  e.text = what + ": " + ofiStrerror(e.code);
  if (!detail.empty()) e.text += " (" + detail + ")";
  return e;
}

#else  // built without libfabric's headers: the transport reports why and nothing else runs

bool ofiLoad(std::string* why) {
  if (why) *why = "tsnet was built without libfabric's headers (install libfabric-dev and rebuild)";
  return false;
}
uint32_t ofiVersion() { return 0; }
uint32_t ofiApiVersion() { return 0; }
std::string ofiVersionText() { return "libfabric not built in"; }
std::string ofiStrerror(int code) { return "libfabric not built in (error " + std::to_string(code) + ")"; }

#endif

}  // namespace tsn
