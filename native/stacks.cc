// native/stacks.h: each thread is sent stackSignal() in turn and writes its own stack from the
// handler; the caller waits for it before it signals the next, so that stacks do not mix.
#include "stacks.h"

#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace tsn {
namespace {

std::atomic<int> g_fd{-1};        // the dump's file while a dump runs, else -1
std::atomic<long> g_want{0};      // the thread whose stack is wanted now
std::atomic<long> g_answered{0};  // the last thread that wrote its stack

void onSignal(int) {
  int saved = errno;
  int fd = g_fd.load(std::memory_order_acquire);
  long me = syscall(SYS_gettid);
  // Outside a dump (a signal that was pending in a thread blocking it), or not the thread
  // asked for now: nothing.
  if (fd >= 0 && me == g_want.load(std::memory_order_acquire)) {
    void* pcs[64];
    int n = backtrace(pcs, 64);
    backtrace_symbols_fd(pcs + 1, n - 1, fd);  // without this handler's own frame
    g_answered.store(me, std::memory_order_release);
  }
  errno = saved;
}

std::string readComm(long tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%ld/comm", tid);
  char buf[64] = "";
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "?";
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r <= 0) return "?";
  buf[r] = 0;
  if (char* nl = strchr(buf, '\n')) *nl = 0;
  return buf;
}

double nowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void say(int fd, const std::string& s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    left -= static_cast<size_t>(w);
  }
}

}  // namespace

bool stackDumpsOn() {
  static const bool on = [] {
    const char* v = getenv("TSNET_STALL_STACKS");
    return v && *v;
  }();
  return on;
}

int stackSignal() { return SIGRTMAX - 5; }

StackDump dumpStacks(const std::string& pathTemplate) {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  StackDump d;
  std::string path;
  for (size_t i = 0; i < pathTemplate.size(); i++) {
    if (pathTemplate[i] == '%' && i + 1 < pathTemplate.size() && pathTemplate[i + 1] == 'p') {
      path += std::to_string(getpid());
      i++;
    } else {
      path += pathTemplate[i];
    }
  }
  d.file = path;
  if (path.empty()) return d.error = "no file named", d;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return d.error = "cannot open " + path + ": " + strerror(errno), d;
  // The first backtrace loads the unwinder (malloc, dlopen): never inside a handler.
  void* warm[2];
  backtrace(warm, 2);
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = onSignal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(stackSignal(), &sa, nullptr);  // stays: see stacks.h
  });
  std::vector<long> tids;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir))
      if (e->d_name[0] != '.') tids.push_back(atol(e->d_name));
    closedir(dir);
  }
  long self = syscall(SYS_gettid);
  say(fd, "=== tsnet: the stacks of process " + std::to_string(getpid()) + ", " + std::to_string(tids.size()) +
              " threads (TSNET_STALL_STACKS; the thread writing this: " + std::to_string(self) + ")\n");
  g_fd.store(fd, std::memory_order_release);
  for (long tid : tids) {
    d.threads++;
    say(fd, "--- thread " + std::to_string(tid) + " (" + readComm(tid) + ")\n");
    g_answered.store(0, std::memory_order_release);
    g_want.store(tid, std::memory_order_release);
    if (syscall(SYS_tgkill, getpid(), tid, stackSignal()) != 0) {
      say(fd, "(gone)\n");
      continue;
    }
    double until = nowS() + 0.2;
    while (g_answered.load(std::memory_order_acquire) != tid && nowS() < until) {
      timespec pause{0, 200000};
      nanosleep(&pause, nullptr);
    }
    if (g_answered.load(std::memory_order_acquire) == tid) d.answered++;
    else say(fd, "(no answer in 200 ms: the thread blocks the signal)\n");
  }
  g_want.store(0, std::memory_order_release);
  g_fd.store(-1, std::memory_order_release);
  close(fd);
  return d;
}

}  // namespace tsn
