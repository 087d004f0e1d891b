// The generated header must be includable from C++ (native/core.cc is C++).
#include "tsnet_abi.h"

static_assert(sizeof(tsn_props_t) == 128, "neutral props");

int main() {
  tsn_props_t props = {};
  return props.maxRecvs;
}
