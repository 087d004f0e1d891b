# Sourced by nccl-tests/run.sh and test/torch/run.sh: the environment of each way of running
# NCCL between the GPUs of one host, with tsnet (the plugin at $so) or NCCL's Socket transport.
#   common          forces NCCL onto the network (no P2P, no SHM, no NVLS) over lo, with NCCL's
#                   INIT and NET INFO lines
#   variant_env V   prints variant V's variables:
#   tsnet           tsnet, its default transport (TCP)
#   tsnet-ofi       tsnet over libfabric, NCCL_NET_GDR_LEVEL=SYS and TSNET_OFI_CUDA_API=1:
#                   GPU buffers go to the plugin (GPUDirect), even through a provider
#                   that calls CUDA inside libfabric, as shm does (it can deadlock)
#   tsnet-ofi-ipc   tsnet-ofi with TSNET_OFI_GPU_IPC=1 (GPU memory registered for
#                   CUDA IPC) and NCCL_CUMEM_ENABLE=0: legacy CUDA IPC cannot export
#                   the cuMem* memory NCCL allocates by default, which would then
#                   move through host memory as in tsnet-ofi
#   tsnet-ofi-host  tsnet over libfabric, NCCL_NET_GDR_LEVEL=LOC: no GPUDirect, NCCL
#                   stages through host memory
#   tsnet-ofi-nics  tsnet-ofi-host with one rail per NIC named (TSNET_OFI_RAILS=nics, the default)
#   tsnet-ofi-auto  tsnet-ofi-host with TSNET_OFI_RAILS=auto: 2 rails on a one-NIC shm device
#                   where the process counts on 16 cores, small messages one rail per comm
#   tsnet-ofi-rails tsnet-ofi-host over 4 rails (OFI_NCCL_FORCE_NUM_RAILS=4): with shm, every
#                   rail an endpoint of its own, so a comm copies on 4 I/O threads
#   tsnet-ofi-rails-comm  tsnet-ofi-rails with TSNET_OFI_SMALL_RAIL=comm: each comm's
#                   small, eager and control messages and single-stripe ones up to
#                   the eager limit on one rail
#   socket          NCCL's Socket transport, defaults
#   socket-tuned    Socket with NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
# The ofi variants take the provider and the library from the caller's extra variables
# (FI_PROVIDER=shm, TSNET_LIBFABRIC=/path/libfabric.so.1).
common=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
        NCCL_SOCKET_IFNAME=lo)
variant_env() {
  local ofi="NCCL_NET=tsnet NCCL_NET_PLUGIN=$so TSNET_TRANSPORT=ofi"
  case $1 in
    tsnet) echo "NCCL_NET=tsnet NCCL_NET_PLUGIN=$so" ;;
    tsnet-ofi) echo "$ofi NCCL_NET_GDR_LEVEL=SYS TSNET_OFI_CUDA_API=1" ;;
    tsnet-ofi-ipc) echo "$ofi NCCL_NET_GDR_LEVEL=SYS TSNET_OFI_CUDA_API=1 TSNET_OFI_GPU_IPC=1 NCCL_CUMEM_ENABLE=0" ;;
    tsnet-ofi-host) echo "$ofi NCCL_NET_GDR_LEVEL=LOC" ;;
    tsnet-ofi-nics) echo "$ofi NCCL_NET_GDR_LEVEL=LOC TSNET_OFI_RAILS=nics" ;;
    tsnet-ofi-auto) echo "$ofi NCCL_NET_GDR_LEVEL=LOC TSNET_OFI_RAILS=auto" ;;
    tsnet-ofi-rails) echo "$ofi NCCL_NET_GDR_LEVEL=LOC OFI_NCCL_FORCE_NUM_RAILS=4" ;;
    tsnet-ofi-rails-comm) echo "$ofi NCCL_NET_GDR_LEVEL=LOC OFI_NCCL_FORCE_NUM_RAILS=4 TSNET_OFI_SMALL_RAIL=comm" ;;
    socket) echo "NCCL_NET=Socket NCCL_NET_PLUGIN=none" ;;
    socket-tuned) echo "NCCL_NET=Socket NCCL_NET_PLUGIN=none NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
