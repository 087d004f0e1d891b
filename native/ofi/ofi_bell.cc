// Doorbells for endpoints without a wait fd (libfabric's shm): ofi_internal.h says why. Plain
// POSIX, no libfabric: a page in /dev/shm (shm_open) and a Unix datagram socket beside it, both
// named after a hash of the endpoint's address. Pathname sockets rather than abstract ones:
// they reach wherever /dev/shm does, which shm needs anyway, across network namespaces too.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "ofi/ofi_internal.h"

namespace tsn {
namespace {

constexpr uint32_t kBellMagic = 0x6c6c6562;  // "bell"
constexpr uint32_t kBellVersion = 1;
constexpr size_t kPageBytes = 4096;
constexpr char kPrefix[] = "tsnet-bell-";

// "tsnet-bell-<16 hex digits>": FNV-1a of the address. Two live endpoints whose addresses hash
// alike would share a name; the second finds it taken (OfiBell::create) and sleeps on the timer.
std::string stem(const std::string& name) {
  char out[48];
  snprintf(out, sizeof out, "%s%016llx", kPrefix, static_cast<unsigned long long>(fnv1a(name)));
  return out;
}

std::string sockPathOf(const std::string& st) { return "/dev/shm/" + st + ".s"; }

// The bells of this process, unlinked at exit (or dlclose) if their endpoints never closed:
// NCCL jobs often exit without finalizing. A process killed leaves them to sweep(). Only by
// the process that made them: a child forked from it (a data loader's worker) runs the same
// destructors when it exits, and must leave its parent's bells in place.
std::mutex g_liveMu;
std::vector<std::pair<std::string, pid_t>>& live() {
  static auto* v = new std::vector<std::pair<std::string, pid_t>>();  // never destroyed: Cleaner reads it last
  return *v;
}
struct Cleaner {
  ~Cleaner() {
    std::lock_guard<std::mutex> g(g_liveMu);
    for (const auto& [st, owner] : live()) {
      if (owner != getpid()) continue;
      shm_unlink(("/" + st).c_str());
      unlink(sockPathOf(st).c_str());
    }
    live().clear();
  }
} g_cleaner;

void track(const std::string& st, bool add) {
  std::lock_guard<std::mutex> g(g_liveMu);
  auto& v = live();
  if (add) v.emplace_back(st, getpid());
  else v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == st; }), v.end());
}

// One unbound socket per process sends every ring.
int senderFd() {
  static int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  return fd;
}

OfiBellPage* mapPage(int fd) {
  void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<OfiBellPage*>(p);
}

// When process pid started, in clock ticks since boot (/proc/<pid>/stat, field 22); 0 when
// unknown. With the pid it names one process, not any that later got the same pid.
uint64_t startTime(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = strrchr(buf, ')');  // the command may hold spaces and parentheses
  if (!p) return 0;
  p++;
  for (int field = 2; field < 21 && *p; field++) {  // field 2 ends at ')'; starttime is field 22
    while (*p == ' ') p++;
    while (*p && *p != ' ') p++;
  }
  return strtoull(p, nullptr, 10);
}

// Whether a bell's owner is gone: its pid is free, or given to a process started later.
bool ownerGone(int32_t owner, uint64_t start) {
  if (owner <= 0) return true;
  if (kill(owner, 0) != 0 && errno == ESRCH) return true;
  uint64_t now = startTime(owner);
  return start && now && now != start;
}

// The owner a bell's page names (pid and start time); false when there is no such page.
bool readOwner(const std::string& st, int32_t* owner, uint64_t* start) {
  int fd = shm_open(("/" + st).c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  *owner = 0;
  *start = 0;
  if (pread(fd, owner, sizeof *owner, offsetof(OfiBellPage, owner)) != sizeof *owner) *owner = 0;
  if (pread(fd, start, sizeof *start, offsetof(OfiBellPage, ownerStart)) != sizeof *start) *start = 0;
  close(fd);
  return true;
}

// Bells of processes that are gone (killed before their endpoints closed): removed once per
// process, before its first bell.
void sweep() {
  static std::once_flag once;
  std::call_once(once, [] {
    DIR* d = opendir("/dev/shm");
    if (!d) return;
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind(kPrefix, 0) != 0 || n.size() < 2 || n.compare(n.size() - 2, 2, ".s") == 0) continue;
      int32_t owner;
      uint64_t start;
      if (readOwner(n, &owner, &start) && ownerGone(owner, start)) {
        shm_unlink(("/" + n).c_str());
        unlink(sockPathOf(n).c_str());
      }
    }
    closedir(d);
  });
}

}  // namespace

std::unique_ptr<OfiBell> OfiBell::create(const std::string& endpointName, std::string* why) {
  sweep();
  auto b = std::make_unique<OfiBell>();
  b->owner = getpid();
  std::string st = stem(endpointName);
  b->shmName = "/" + st;
  b->sockPath = sockPathOf(st);
  auto fail = [&](const char* what) {
    *why = std::string(what) + " " + b->sockPath.substr(0, b->sockPath.size() - 2) + ": " + strerror(errno);
    return nullptr;
  };
  // A bell of this name whose owner lives is another endpoint's (the same hash): left to it.
  // One whose owner is gone is stale (sweep() ran once, before this process's first bell; the
  // owner may have died since), and is replaced.
  int32_t owner;
  uint64_t start;
  if (readOwner(st, &owner, &start) && !ownerGone(owner, start)) {
    std::string taken = b->sockPath.substr(0, b->sockPath.size() - 2);
    b->shmName.clear();  // not ours: not removed at close
    b->sockPath.clear();
    *why = taken + " is in use by process " + std::to_string(owner);
    return nullptr;
  }
  b->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (b->fd < 0) return fail("socket");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (b->sockPath.size() >= sizeof a.sun_path) return fail("socket path too long:");
  memcpy(a.sun_path, b->sockPath.c_str(), b->sockPath.size() + 1);
  unlink(b->sockPath.c_str());
  if (bind(b->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    b->sockPath.clear();  // not ours: not unlinked at close
    return fail("bind");
  }
  shm_unlink(b->shmName.c_str());
  int fd = shm_open(b->shmName.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    b->shmName.clear();
    return fail("shm_open");
  }
  if (ftruncate(fd, kPageBytes) != 0 || !(b->page = mapPage(fd))) {
    close(fd);
    return fail("ftruncate or mmap");
  }
  close(fd);
  b->page->version = kBellVersion;
  b->page->owner = static_cast<int32_t>(getpid());
  b->page->ownerStart = startTime(getpid());
  b->page->asleep.store(0, std::memory_order_relaxed);
  b->page->magic.store(kBellMagic, std::memory_order_release);
  track(st, true);
  return b;
}

OfiBell::~OfiBell() {
  bool mine = owner == getpid();  // not in a forked child: the files are its parent's
  if (page) track(shmName.substr(1), false);
  if (page) munmap(page, kPageBytes);
  if (mine && !shmName.empty()) shm_unlink(shmName.c_str());
  if (fd >= 0) close(fd);
  if (mine && !sockPath.empty()) unlink(sockPath.c_str());
}

std::shared_ptr<OfiPeerBell> OfiPeerBell::open(const std::string& endpointName) {
  std::string st = stem(endpointName);
  int fd = shm_open(("/" + st).c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  struct stat sb;
  OfiBellPage* page = fstat(fd, &sb) == 0 && static_cast<size_t>(sb.st_size) >= kPageBytes ? mapPage(fd) : nullptr;
  close(fd);
  if (!page) return nullptr;
  auto b = std::make_shared<OfiPeerBell>();
  b->page = page;
  if (page->magic.load(std::memory_order_acquire) != kBellMagic || page->version != kBellVersion) return nullptr;
  std::string path = sockPathOf(st);
  b->addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof b->addr.sun_path) return nullptr;
  memcpy(b->addr.sun_path, path.c_str(), path.size() + 1);
  b->addrLen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return b;
}

bool OfiPeerBell::ring() {
  // Dekker with the sleeper, which arms and then polls: the post's stores, then this load.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (page->asleep.load(std::memory_order_relaxed) == 0) return false;
  if (page->asleep.exchange(0, std::memory_order_seq_cst) == 0) return false;
  char c = 1;
  // A full socket has rung already; a peer gone has nothing to wake.
  ssize_t w = sendto(senderFd(), &c, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), addrLen);
  (void)w;
  return true;
}

OfiPeerBell::~OfiPeerBell() {
  if (page) munmap(page, kPageBytes);
}

}  // namespace tsn
