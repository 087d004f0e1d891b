/* Prints, as JSON, sizeof and every member's [offset, size] of each generated C struct,
 * as the compiler lays them out: {"tsn_props_v6_t": {"size": 48, "members": {"name": [0, 8], ...}}, ...} */
#include <stdio.h>

#include "tsnet_abi.h"
#include "abi_members.h"

static int first_struct = 1;
static int first_member;

static void begin(const char* type, size_t size) {
  printf("%s\n  \"%s\": {\"size\": %zu, \"members\": {", first_struct ? "{" : ",", type, size);
  first_struct = 0;
  first_member = 1;
}

static void member(const char* name, size_t offset, size_t size) {
  printf("%s\"%s\": [%zu, %zu]", first_member ? "" : ", ", name, offset, size);
  first_member = 0;
}

#define MEMBER(T, m) member(#m, offsetof(T, m), sizeof(((T*)0)->m));
#define STRUCT(T, LIST) begin(#T, sizeof(T)); LIST(MEMBER, T) printf("}}");

int main(void) {
  STRUCT(tsn_props_v6_t, PROPS_V6)
  STRUCT(tsn_props_v7_t, PROPS_V7)
  STRUCT(tsn_props_v8_t, PROPS_V8)
  STRUCT(tsn_props_v9_t, PROPS_V9)
  STRUCT(tsn_props_v10_t, PROPS_V10)
  STRUCT(tsn_props_v11_t, PROPS_V11)
  STRUCT(tsn_props_v12_t, PROPS_V12)
  STRUCT(tsn_props_t, PROPS_V12)
  STRUCT(tsn_vprops_v9_t, VPROPS)
  STRUCT(tsn_vprops_v10_t, VPROPS)
  STRUCT(tsn_vprops_v11_t, VPROPS)
  STRUCT(tsn_vprops_v12_t, VPROPS)
  STRUCT(tsn_vprops_t, VPROPS)
  STRUCT(tsn_net_v6_t, TABLE_V6)
  STRUCT(tsn_net_v7_t, TABLE_V7)
  STRUCT(tsn_net_v8_t, TABLE_V8)
  STRUCT(tsn_net_v9_t, TABLE_V9)
  STRUCT(tsn_net_v10_t, TABLE_V10)
  STRUCT(tsn_net_v11_t, TABLE_V11)
  STRUCT(tsn_net_v12_t, TABLE_V12)
  STRUCT(tsn_comm_config_t, COMM_CONFIG)
  STRUCT(tsn_dev_handle_t, DEV_HANDLE)
  STRUCT(tsn_net_attr_peers_t, NET_ATTR_PEERS)
  STRUCT(tsn_net_attr_t, NET_ATTR)
  printf("\n}\n");
  return 0;
}
