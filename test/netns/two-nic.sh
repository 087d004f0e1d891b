#!/usr/bin/env bash
# Two network namespaces joined by two veth pairs; the C driver's receiver runs in one, its
# sender in the other, over one tsnet device made of both veths (TSNET_DEVICE_GROUPS=a+b).
# Checks that data crosses intact (transfer, 0 B to 64 MiB, validated) and that a bulk stream
# (8 x 64 MiB) is spread over both veths: each carries at least MIN_SHARE% of the bytes,
# measured from /sys/class/net/<veth>/statistics/tx_bytes inside the sender's namespace.
# A control run over one veth only shows the measurement can tell the difference.
#
#   test/netns/two-nic.sh            (root; exit 0 pass, 1 fail, 77 skipped with a reason)
#
# Environment: TSNET_NETNS_DRIVER (default build/test/driver), TSNET_DRIVER_LIB (default
# build/libnccl-net-tsnet.so), TSNET_NETNS_VERSION (table version, default 12),
# TSNET_NETNS_TRANSPORT (tcp, the default, or ofi: libfabric's tcp provider, whose two NICs
# are the device's two rails).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DRIVER=${TSNET_NETNS_DRIVER:-$ROOT/build/test/driver}
LIB=${TSNET_DRIVER_LIB:-$ROOT/build/libnccl-net-tsnet.so}
VERSION=${TSNET_NETNS_VERSION:-12}
TRANSPORT=${TSNET_NETNS_TRANSPORT:-tcp}
MIN_SHARE=30                     # percent of the payload each veth must carry
PAYLOAD=$((8 * 64 * 1024 * 1024)) # driver bulk: 8 messages of 64 MiB
STEP_TIMEOUT=180                  # seconds for any one driver run

skip() { echo "SKIP: $*"; exit 77; }
fails=0
ok() { echo "ok - netns: $*"; }
notok() { echo "not ok - netns: $*"; fails=$((fails + 1)); }

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "needs iproute2's ip (apt-get install -y iproute2)"
command -v timeout >/dev/null 2>&1 || skip "needs coreutils' timeout"
[ -x "$DRIVER" ] || { echo "not ok - netns: the driver $DRIVER is missing (build it: see docs/testing.md)"; exit 1; }
[ -f "$LIB" ] || { echo "not ok - netns: the library $LIB is missing (npm run build)"; exit 1; }

# Unique per run: namespaces, veth names (at most 15 characters), the rendezvous folder.
id=$(printf '%04x%02x' $(($$ & 0xffff)) $((RANDOM & 0xff)))
NSA=tsnet-a-$id
NSB=tsnet-b-$id
A1=ta${id}1 A2=ta${id}2 B1=tb${id}1 B2=tb${id}2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tsnet-netns.XXXXXX")
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$NSA" 2>/dev/null
  ip netns del "$NSB" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NSA" 2>"$WORK/err" || skip "cannot create a network namespace: $(cat "$WORK/err")"
ip netns add "$NSB" 2>"$WORK/err" || skip "cannot create a network namespace: $(cat "$WORK/err")"
ip link add "$A1" netns "$NSA" type veth peer name "$B1" netns "$NSB" 2>"$WORK/err" ||
  skip "cannot create veth pairs: $(cat "$WORK/err")"
ip link add "$A2" netns "$NSA" type veth peer name "$B2" netns "$NSB" 2>"$WORK/err" ||
  skip "cannot create veth pairs: $(cat "$WORK/err")"
set -e
ip -n "$NSA" addr add 10.231.1.1/24 dev "$A1"
ip -n "$NSA" addr add 10.231.2.1/24 dev "$A2"
ip -n "$NSB" addr add 10.231.1.2/24 dev "$B1"
ip -n "$NSB" addr add 10.231.2.2/24 dev "$B2"
for d in lo "$A1" "$A2"; do ip -n "$NSA" link set "$d" up; done
for d in lo "$B1" "$B2"; do ip -n "$NSB" link set "$d" up; done
set +e
ok "namespaces $NSA and $NSB joined by $A1-$B1 (10.231.1.0/24) and $A2-$B2 (10.231.2.0/24)"

# Waits (at most STEP_TIMEOUT) for both interfaces' carriers.
for i in $(seq 50); do
  up=$( (ip -n "$NSA" -br link; ip -n "$NSB" -br link) | grep -c "^t[ab]$id[12][@ ].* UP ")
  [ "$up" = 4 ] && break
  sleep 0.1
done
[ "$up" = 4 ] && ok "all four veths are up" || notok "only $up of 4 veths came up"

tx() { ip netns exec "$NSB" cat "/sys/class/net/$1/statistics/tx_bytes"; }

# run NAME SCENARIO RECV_ENV SEND_ENV: the receiver in ns-a, the sender in ns-b, one rendezvous.
run() {
  local name=$1 scenario=$2 renv=$3 senv=$4
  local rdv="$WORK/$name"
  mkdir -p "$rdv"
  # shellcheck disable=SC2086
  timeout -k 5 "$STEP_TIMEOUT" ip netns exec "$NSA" env $renv "$DRIVER" "$scenario" --role recv --rendezvous "$rdv" \
    --version "$VERSION" --lib "$LIB" --timeout 60 >"$WORK/$name.recv.out" 2>"$WORK/$name.recv.err" &
  local rpid=$!
  PIDS+=("$rpid")
  # shellcheck disable=SC2086
  timeout -k 5 "$STEP_TIMEOUT" ip netns exec "$NSB" env $senv "$DRIVER" "$scenario" --role send --rendezvous "$rdv" \
    --version "$VERSION" --lib "$LIB" --timeout 60 >"$WORK/$name.send.out" 2>"$WORK/$name.send.err"
  local sst=$?
  wait "$rpid"
  local rst=$?
  local role st
  for role in recv send; do
    [ $role = recv ] && st=$rst || st=$sst
    grep '^not ok' "$WORK/$name.$role.out" | sed "s/^/  [$name $role] /"
    if [ "$st" = 0 ]; then
      ok "$name: the $role role passed ($(tail -n 1 "$WORK/$name.$role.out"))"
    else
      notok "$name: the $role role exited $st ($(tail -n 1 "$WORK/$name.$role.out" 2>/dev/null))"
      tail -n 20 "$WORK/$name.$role.err" | sed "s/^/  [$name $role stderr] /"
    fi
  done
  [ "$rst" = 0 ] && [ "$sst" = 0 ]
}

if [ "$TRANSPORT" = ofi ]; then
  # libfabric's tcp provider: one NIC per interface (a domain each); FI_TCP_IFACE keeps one.
  OFI="TSNET_TRANSPORT=ofi FI_PROVIDER=tcp TSNET_TIMEOUT_SEC=10"
  TWO_A="$OFI TSNET_DEVICE_GROUPS=$A1+$A2"
  TWO_B="$OFI TSNET_DEVICE_GROUPS=$B1+$B2"
  ONE_A="$OFI FI_TCP_IFACE=$A1"
  ONE_B="$OFI FI_TCP_IFACE=$B1"
else
  TWO_A="TSNET_TRANSPORT=tcp NCCL_SOCKET_IFNAME==$A1,$A2 TSNET_DEVICE_GROUPS=$A1+$A2"
  TWO_B="TSNET_TRANSPORT=tcp NCCL_SOCKET_IFNAME==$B1,$B2 TSNET_DEVICE_GROUPS=$B1+$B2"
  ONE_A="TSNET_TRANSPORT=tcp NCCL_SOCKET_IFNAME==$A1"
  ONE_B="TSNET_TRANSPORT=tcp NCCL_SOCKET_IFNAME==$B1"
fi
ok "transport $TRANSPORT"

# 1. Data crosses the two-NIC device intact, 0 B to 64 MiB.
run transfer transfer "$TWO_A" "$TWO_B"

# share NAME B1_BEFORE B2_BEFORE: prints the deltas, sets d1 d2.
measure() {
  local name=$1 b1=$2 b2=$3
  d1=$(($(tx "$B1") - b1))
  d2=$(($(tx "$B2") - b2))
  echo "# $name: $B1 sent $d1 bytes ($((100 * d1 / PAYLOAD))% of the payload), $B2 sent $d2 bytes ($((100 * d2 / PAYLOAD))%)"
}

# 2. The bulk stream over the two-NIC device: each veth carries at least MIN_SHARE%.
b1=$(tx "$B1") b2=$(tx "$B2")
if run bulk bulk "$TWO_A" "$TWO_B"; then
  measure "two-NIC device" "$b1" "$b2"
  total=$((d1 + d2))
  if [ $((100 * d1)) -ge $((MIN_SHARE * PAYLOAD)) ] && [ $((100 * d2)) -ge $((MIN_SHARE * PAYLOAD)) ] &&
    [ $((100 * d1)) -ge $((MIN_SHARE * total)) ] && [ $((100 * d2)) -ge $((MIN_SHARE * total)) ]; then
    ok "8 x 64 MiB over $B1+$B2: each veth carried at least $MIN_SHARE% ($d1 and $d2 bytes of $PAYLOAD)"
  else
    notok "8 x 64 MiB over $B1+$B2 not spread: $B1 carried $d1, $B2 $d2 bytes of a $PAYLOAD-byte payload (want >= $MIN_SHARE% each)"
  fi
else
  notok "bulk over the two-NIC device failed: no spread measured"
fi

# 3. Control: the same stream over one veth leaves the other (nearly) idle.
b1=$(tx "$B1") b2=$(tx "$B2")
if run control bulk "$ONE_A" "$ONE_B"; then
  measure "one-NIC device" "$b1" "$b2"
  if [ $((100 * d1)) -ge $((95 * PAYLOAD)) ] && [ $((100 * d2)) -lt $((5 * PAYLOAD)) ]; then
    ok "control: 8 x 64 MiB over $B1 alone: $B1 carried $d1 bytes, $B2 $d2 (the counters tell the NICs apart)"
  else
    notok "control: over $B1 alone, $B1 carried $d1 and $B2 $d2 bytes: the counters do not measure what this test assumes"
  fi
else
  notok "bulk over one veth failed"
fi

if [ "$fails" = 0 ]; then echo "PASS"; exit 0; fi
echo "FAIL: $fails check(s) failed"
exit 1
