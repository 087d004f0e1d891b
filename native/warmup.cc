// The warm-up at the process's first init (TSNET_WARMUP, docs/performance.md items 14, 15).
//
// V8 runs the plugin's data path in its interpreter until a function has been called a few
// thousand times, and throws compiled code away when an object changes in a way it had not
// seen (a field written again, a number that is no longer small, a second instance of a
// class). Until the code is compiled for good, an 8-byte message costs several times its
// steady latency, and an 8-byte AllReduce over libfabric took about 2000 operations to settle.
// So the first init, before it returns to NCCL, sends messages to itself through the
// plugin's own entry points, as NCCL's proxy would: one listener and one comm pair on
// device 0 per protocol thread, host buffers registered on the comms, test() until every
// request ended, then everything closed; twice, the first time briefly (see warmUp). The
// batches vary what NCCL varies (see Run::batch): sizes of 0 and 8 bytes, 4 KiB and 64 KiB
// (eager, eager with a payload, written or striped), up to 4 messages in flight, two tags,
// offsets in the region, receives posted ahead of their messages, with them and after them,
// grouped receives. A step that fails stops the warm-up with an INFO line; init still succeeds
// (the plugin's own WARN, if any, names what failed). It is bounded in time.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "../embed/host.h"
#include "internal.h"
#include "warmup.h"

namespace tsn {

namespace {

thread_local bool t_warming = false;

constexpr int kWindow = 4;                      // messages in flight per comm, at most
constexpr size_t kMaxMsg = 65536;               // the largest message
constexpr size_t kSlot = kMaxMsg + 4096;        // each message in flight has its own slot
constexpr size_t kBufBytes = kWindow * kSlot;   // per comm
constexpr double kConnectSeconds = 2.0;         // listen to every comm up
constexpr double kRunSeconds = 1.0;             // the messages themselves

double nowS() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Message m's size: mostly 8 bytes (what latency-bound collectives send), every 8th 4 KiB
// (eager, with a payload), every 16th none (NCCL sends empty messages too: under NCCL V8 threw
// away code compiled without them), every 32nd 64 KiB (above the eager limit: written, or
// striped).
size_t sizeOf(int m) { return m % 32 == 31 ? kMaxMsg : m % 8 == 3 ? 4096 : m % 16 == 6 ? 0 : 8; }

struct Pair {
  unsigned char handle[TSN_HANDLE_SIZE] = {};
  void* lc = nullptr;
  void* sc = nullptr;
  void* rc = nullptr;
  void* smr = nullptr;
  void* rmr = nullptr;
  void* sreq[kWindow] = {};
  void* rreq[kWindow] = {};
  char* sbuf = nullptr;
  char* rbuf = nullptr;
};

struct Run {
  std::vector<Pair> pairs;
  const char* stopped = nullptr;  // the step that failed, or nullptr
  tsn_result_t rc = TSN_SUCCESS;
  int sent = 0;  // messages per pair so far
  double roundTrip = 100e-6;  // how long a batch of receives and sends took, lately (seconds)

  bool fail(const char* step, tsn_result_t r) {
    if (!stopped) stopped = step, rc = r;
    return false;
  }

  bool open(void* ctx, int n) {
    pairs.resize(static_cast<size_t>(n));
    for (Pair& p : pairs) {
      p.sbuf = static_cast<char*>(calloc(1, kBufBytes));
      p.rbuf = static_cast<char*>(calloc(1, kBufBytes));
      if (!p.sbuf || !p.rbuf) return fail("allocating its buffers", TSN_SYSTEM_ERROR);
    }
    // listen picks the protocol threads round robin: one listener on each.
    for (Pair& p : pairs) {
      tsn_result_t r = tsn_listen(ctx, 0, p.handle, &p.lc);
      if (r != TSN_SUCCESS) return fail("listen", r);
    }
    double end = nowS() + kConnectSeconds;
    for (;;) {
      bool up = true;
      for (Pair& p : pairs) {
        tsn_result_t r;
        if (!p.sc && (r = tsn_connect(ctx, 0, nullptr, p.handle, &p.sc, nullptr)) != TSN_SUCCESS) return fail("connect", r);
        if (!p.rc && (r = tsn_accept(p.lc, &p.rc, nullptr)) != TSN_SUCCESS) return fail("accept", r);
        up = up && p.sc && p.rc;
      }
      if (up) break;
      if (nowS() > end) return fail("connecting (timed out)", TSN_SYSTEM_ERROR);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    for (Pair& p : pairs) {
      tsn_result_t r;
      if ((r = tsn_reg_mr(p.sc, p.sbuf, kBufBytes, TSN_PTR_HOST, &p.smr)) != TSN_SUCCESS) return fail("regMr", r);
      if ((r = tsn_reg_mr(p.rc, p.rbuf, kBufBytes, TSN_PTR_HOST, &p.rmr)) != TSN_SUCCESS) return fail("regMr", r);
    }
    return true;
  }

  // Polls a request; true once it ended (a failure stops the run).
  bool ended(void*& req, const char* step) {
    if (!req) return true;
    int done = 0;
    int sizes[TSN_MAX_RECVS] = {};
    tsn_result_t r = tsn_test(req, &done, sizes);
    if (r != TSN_SUCCESS) {
      req = nullptr;  // a failed request has ended too
      fail(step, r);
      return true;
    }
    if (done) req = nullptr;
    return done != 0;
  }

  // Tests every send (and, with recvs, every receive) of every pair until all ended, or for
  // at most `upTo` seconds when given (then false if some are still in flight).
  bool drain(bool recvs, double upTo, double end) {
    double limit = upTo > 0 ? nowS() + upTo : 0;
    for (;;) {
      bool all = true;
      for (Pair& p : pairs)
        for (int j = 0; j < kWindow; j++) {
          all = ended(p.sreq[j], "a send") && all;
          if (recvs) all = ended(p.rreq[j], "a receive") && all;
        }
      if (stopped) return false;
      if (all) return true;
      double now = nowS();
      if (limit && now > limit) return false;
      if (now > end) return fail("waiting for a message (timed out)", TSN_SYSTEM_ERROR);
    }
  }

  bool postRecvs(int b, int k, bool grouped) {
    for (Pair& p : pairs) {
      void* data[kWindow];
      size_t sizes[kWindow];
      int tags[kWindow];
      void* mrs[kWindow];
      for (int j = 0; j < k; j++) {
        data[j] = p.rbuf + j * kSlot + (b % 8) * 8;
        sizes[j] = kMaxMsg;  // room for the largest; the send says how much came
        tags[j] = grouped ? j : j % 2;
        mrs[j] = p.rmr;
      }
      tsn_result_t r;
      if (grouped) {
        r = tsn_irecv(p.rc, k, data, sizes, tags, mrs, nullptr, &p.rreq[0]);
        if (r != TSN_SUCCESS || !p.rreq[0]) return fail("irecv", r != TSN_SUCCESS ? r : TSN_INTERNAL_ERROR);
        continue;
      }
      for (int j = 0; j < k; j++) {
        r = tsn_irecv(p.rc, 1, &data[j], &sizes[j], &tags[j], &mrs[j], nullptr, &p.rreq[j]);
        if (r != TSN_SUCCESS || !p.rreq[j]) return fail("irecv", r != TSN_SUCCESS ? r : TSN_INTERNAL_ERROR);
      }
    }
    return true;
  }

  bool postSends(int b, int k, bool grouped) {
    for (Pair& p : pairs)
      for (int j = 0; j < k; j++) {
        int tag = grouped ? j : j % 2;
        tsn_result_t r = tsn_isend(p.sc, p.sbuf + j * kSlot + (b % 8) * 8, sizeOf(sent + j), tag, p.smr, nullptr, &p.sreq[j]);
        if (r != TSN_SUCCESS || !p.sreq[j]) return fail("isend", r != TSN_SUCCESS ? r : TSN_INTERNAL_ERROR);
      }
    return true;
  }

  // Batch b on every pair: 1 to kWindow messages in flight, tags 0 and 1, buffers at varying
  // offsets of the registered region. The order varies as NCCL's does, in fours:
  //   - two batches post their receives, wait about twice as long as a batch lately took (so
  //     that the receiver's word of them reaches the sender, as with NCCL's receives posted
  //     ahead) and only then their sends, which the protocol then writes straight into the
  //     receive buffers instead of sending them eager: NCCL's usual path, which the other
  //     orders reach only above the eager limit;
  //   - one posts its receives and sends at once;
  //   - one posts its receives only after its sends (eager messages then arrive before their
  //     receive).
  // The number of messages cycles through every order. Every 8th batch and every 16th early
  // one receive two or more in one grouped receive, as NCCL does with maxRecvs > 1.
  bool batch(int b, double end) {
    int k = 1 + (b + b / 4) % kWindow;
    bool early = b % 4 == 0 || b % 4 == 3;
    bool late = b % 4 == 2;
    bool grouped = (b % 8 == 5 || b % 16 == 3) && k > 1;
    double t0 = nowS();
    if (late) {
      if (!postSends(b, k, grouped)) return false;
      drain(false, 200e-6, end);  // eager sends end on their own; a written one waits for its receive
      if (stopped || !postRecvs(b, k, grouped)) return false;
    } else if (early) {
      if (!postRecvs(b, k, grouped)) return false;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(500e-6, std::max(20e-6, 2 * roundTrip))));
      if (!postSends(b, k, grouped)) return false;
    } else if (!postRecvs(b, k, grouped) || !postSends(b, k, grouped)) {
      return false;
    }
    if (!drain(true, 0, end)) return false;
    if (!late && !early) roundTrip = 0.75 * roundTrip + 0.25 * (nowS() - t0);
    sent += k;
    return true;
  }

  // Closes what was opened; requests still in flight end with their comms.
  void close() {
    for (Pair& p : pairs) {
      if (p.smr) tsn_dereg_mr(p.sc, p.smr);
      if (p.rmr) tsn_dereg_mr(p.rc, p.rmr);
      if (p.sc) tsn_close_send(p.sc);
      if (p.rc) tsn_close_recv(p.rc);
      if (p.lc) tsn_close_listen(p.lc);
      free(p.sbuf);
      free(p.rbuf);
    }
    pairs.clear();
  }
};

}  // namespace

bool warmingUp() { return t_warming; }

void warmUp(void* ctx, int messages) {
  if (messages <= 0) return;
  struct Marked {
    Marked() { t_warming = true; }
    ~Marked() { t_warming = false; }
  } marked;
  int ndev = 0;
  if (tsn_devices(&ndev) != TSN_SUCCESS || ndev < 1) {
    log(kLogInfo, "warm-up skipped: no device");
    return;
  }
  int threads = hostThreads();
  double t0 = nowS();
  double end = t0 + kRunSeconds;
  Run run;
  // Two rounds of comms. Closing the first round's comms and opening the second's changes
  // the plugin's objects the way a job's later comms and deregistrations do (a field written
  // again, a second instance of a class): V8 then throws away every function compiled with
  // the assumption that it never changes. So the first round is short, and the second, the
  // bulk, compiles the code that NCCL's traffic will run.
  int first = messages < 800 ? messages / 2 : 400;
  for (int round = 0, b = 0; round < 2 && !run.stopped; round++) {
    int upTo = round == 0 ? first : messages;
    if (run.open(ctx, threads)) {
      while (run.sent < upTo && run.batch(b++, end + kConnectSeconds))
        if (nowS() > end) break;
    }
    run.close();
    if (nowS() > end) break;
  }
  double ms = (nowS() - t0) * 1e3;
  if (run.stopped)
    log(kLogInfo, "warm-up stopped after %d of %d message(s) per protocol thread: %s failed (result %d); init goes on",
        run.sent, messages, run.stopped, static_cast<int>(run.rc));
  else
    log(kLogInfo, "warm-up: %d of %d message(s) of 0 B to 64 KiB on each of %d protocol thread(s) in %.0f ms (TSNET_WARMUP)",
        run.sent, messages, threads, ms);
}

}  // namespace tsn
