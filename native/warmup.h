// The warm-up at the process's first init (TSNET_WARMUP): native/warmup.cc.
#pragma once

namespace tsn {

// Sends `messages` messages per protocol thread to itself through the tsn_* entry points
// (ctx: the context init just made, nullptr for v6-v10), then closes everything. Never fails
// init: a step that fails ends it with an INFO line.
void warmUp(void* ctx, int messages);

// True on the thread running warmUp, while it runs: the requests it posts are marked as the
// warm-up's (TSNET_STATS=steps counts them apart from NCCL's).
bool warmingUp();

}  // namespace tsn
