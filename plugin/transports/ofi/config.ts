// Settings of the libfabric transport: aws-ofi-nccl's OFI_NCCL_* variables where tsnet has the
// same knob (so experiments move over without edits) and TSNET_FLUSH. Read once, validated (a
// bad value is an error naming the variable), and described in lines to log at INFO.
import { invalidArgument } from '../../errors';
import { type FlushMode, autoFlush } from './policy/flush';

export interface OfiConfig {
  /** Largest eager message, its 8-byte header included; -1 disables eager (OFI_NCCL_EAGER_MAX_SIZE). */
  eagerMax: number;
  /** Smallest stripe of a striped message (OFI_NCCL_MIN_STRIPE_SIZE). */
  minStripe: number;
  /** Messages smaller than this go whole on one rail, round-robin (OFI_NCCL_SCHED_MAX_SMALL_RR_SIZE). */
  smallRrMax: number;
  /** Control messages round-robin over rails instead of rail 0 (OFI_NCCL_RR_CTRL_MSG). */
  rrCtrl: boolean;
  /**
   * TSNET_OFI_SMALL_RAIL: 'rr' (aws-ofi-nccl's schedule): eager messages, single-stripe writes
   * and control messages take turns over the rails; 'comm': each comm keeps its eager messages,
   * its single-stripe writes up to the eager limit and its control messages on one rail of its
   * own (its home rail: the sending comm's id modulo the rails), so that a comm's small traffic
   * crosses one I/O thread per side; longer messages spread as with 'rr'.
   */
  smallRail: SmallRail;
  /** TSNET_OFI_SMALL_RAIL was given (else the rails' choice may pick 'comm': policy/rails.ts, chooseRails). */
  smallRailSet: boolean;
  /** Rails a device uses, repeating or dropping NICs; 0: one per NIC (OFI_NCCL_FORCE_NUM_RAILS). */
  forceRails: number;
  /**
   * TSNET_OFI_RAILS, where OFI_NCCL_FORCE_NUM_RAILS is not given: 'nics' (the default): one rail
   * per NIC, as aws-ofi-nccl; 'auto' gives a one-NIC shm device 2 rails where the process has
   * the cores and /dev/shm the space (policy/rails.ts, chooseRails).
   */
  rails: RailsMode;
  /** Bounce buffers posted per endpoint, spread over its rails (OFI_NCCL_RDMA_MIN_POSTED_EAGER_BUFFERS). */
  bouncePosted: number;
  /** Flush policy (TSNET_FLUSH, OFI_NCCL_GDR_FLUSH_DISABLE, OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE). */
  flush: FlushMode;
  /**
   * TSNET_OFI_GPU_IPC: register GPU memory with FI_HMEM_DEVICE_ONLY as well, so that shm moves
   * it between processes by CUDA IPC (device to device); written sends from it then complete
   * on the receiver's acknowledgement. A peer in this same process gets the plain registration.
   */
  gpuIpc: boolean;
  /**
   * TSNET_OFI_CUDA_API: GPU memory is registered even through a provider that calls CUDA inside
   * libfabric on tsnet's I/O threads (shm does), which can deadlock with the application's CUDA
   * calls. Off: GPU memory only where endpoints accept FI_OPT_CUDA_API_PERMITTED = false, else
   * host memory (NCCL stages through it).
   */
  cudaApi: boolean;
  /**
   * DMA-BUF registration of GPU memory is offered (ptrSupport DMA-BUF) where libfabric, the
   * kernel and the GPUs allow it; off with OFI_NCCL_DISABLE_DMABUF=1, as in aws-ofi-nccl.
   */
  dmabuf: boolean;
  /**
   * TSNET_OFI_CHECK_SENDER: ask the provider for FI_SOURCE, so that a message or remote write
   * that names a comm is taken only from that comm's peer (endpoint.ts, "senders"); where the
   * provider cannot say, nothing is checked and the INFO line says so.
   */
  checkSender: boolean;
  /**
   * TSNET_OFI_BELL: an endpoint without a wait fd (shm) gets a doorbell, which its peers ring
   * when they post to it while its I/O thread sleeps (native/ofi/ofi_bell.cc), so that the
   * thread sleeps until then instead of polling on a timer (1 ms; 50 us in the first ms after
   * work) while only receives are posted on it.
   */
  bell: boolean;
}

type Env = Record<string, string | undefined>;

export type SmallRail = 'rr' | 'comm';
export type RailsMode = 'auto' | 'nics';

/** Most rails a device may have: one key per rail fits a 64-byte control entry. */
export const MAX_RAILS = 4;

export const OFI_DEFAULTS: OfiConfig = {
  eagerMax: 8192,
  minStripe: 128 * 1024,
  smallRrMax: 64,
  rrCtrl: true,
  smallRail: 'rr',
  smallRailSet: false,
  forceRails: 0,
  rails: 'nics',
  bouncePosted: 64,
  flush: { method: 'read', all: false },
  gpuIpc: false,
  cudaApi: false,
  dmabuf: true,
  checkSender: true,
  bell: true,
};

function int(env: Env, name: string, min: number, max: number): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  const v = raw.trim();
  if (!/^-?\d+$/.test(v)) throw invalidArgument(`${name}=${raw}: expected an integer`);
  const n = Number(v);
  if (n < min || n > max) throw invalidArgument(`${name}=${raw}: expected ${min} to ${max}`);
  return n;
}

function bool(env: Env, name: string): boolean | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  const v = raw.trim().toLowerCase();
  if (v === '1' || v === 'true' || v === 'yes') return true;
  if (v === '0' || v === 'false' || v === 'no') return false;
  throw invalidArgument(`${name}=${raw}: expected 0 or 1`);
}

export function readOfiConfig(env: Env = process.env): { config: OfiConfig; lines: string[] } {
  const lines: string[] = [];
  const d = OFI_DEFAULTS;
  const note = (key: string, value: unknown, name: string, set: boolean) => lines.push(`ofi ${key} = ${value} (${set ? name : 'default'})`);

  const eager = int(env, 'OFI_NCCL_EAGER_MAX_SIZE', -1, 1 << 20);
  const eagerMax = eager ?? d.eagerMax;
  note('eager max bytes (header included)', eagerMax < 0 ? 'disabled' : eagerMax, 'OFI_NCCL_EAGER_MAX_SIZE', eager !== undefined);

  const stripe = int(env, 'OFI_NCCL_MIN_STRIPE_SIZE', 1, 1 << 30);
  const minStripe = stripe ?? d.minStripe;
  note('min stripe bytes', minStripe, 'OFI_NCCL_MIN_STRIPE_SIZE', stripe !== undefined);

  const small = int(env, 'OFI_NCCL_SCHED_MAX_SMALL_RR_SIZE', 0, 1 << 30);
  const smallRrMax = small ?? d.smallRrMax;
  note('round-robin below bytes', smallRrMax, 'OFI_NCCL_SCHED_MAX_SMALL_RR_SIZE', small !== undefined);

  const rr = bool(env, 'OFI_NCCL_RR_CTRL_MSG');
  const rrCtrl = rr ?? d.rrCtrl;
  note('control messages round-robin', rrCtrl, 'OFI_NCCL_RR_CTRL_MSG', rr !== undefined);

  const srRaw = env.TSNET_OFI_SMALL_RAIL;
  const sr = srRaw === undefined || srRaw === '' ? undefined : srRaw.trim().toLowerCase();
  if (sr !== undefined && sr !== 'rr' && sr !== 'comm') throw invalidArgument(`TSNET_OFI_SMALL_RAIL=${srRaw}: expected rr or comm`);
  const smallRail: SmallRail = (sr as SmallRail | undefined) ?? d.smallRail;
  if (sr !== undefined) note('small messages\' rails', smallRail === 'rr' ? 'round-robin' : 'one per comm', 'TSNET_OFI_SMALL_RAIL', true);
  else lines.push("ofi small messages' rails = round-robin (default; one per comm on the rails TSNET_OFI_RAILS=auto adds)");

  const force = int(env, 'OFI_NCCL_FORCE_NUM_RAILS', 0, MAX_RAILS);
  const forceRails = force ?? d.forceRails;
  if (forceRails) note('rails', forceRails, 'OFI_NCCL_FORCE_NUM_RAILS', true);
  const rRaw = env.TSNET_OFI_RAILS;
  const rm = rRaw === undefined || rRaw === '' ? undefined : rRaw.trim().toLowerCase();
  if (rm !== undefined && rm !== 'auto' && rm !== 'nics') throw invalidArgument(`TSNET_OFI_RAILS=${rRaw}: expected auto or nics`);
  const rails: RailsMode = (rm as RailsMode | undefined) ?? d.rails;
  if (rm !== undefined && forceRails) lines.push(`ofi TSNET_OFI_RAILS=${rRaw} ignored: OFI_NCCL_FORCE_NUM_RAILS=${forceRails} is given`);

  const posted = int(env, 'OFI_NCCL_RDMA_MIN_POSTED_EAGER_BUFFERS', 1, 65536);
  const bouncePosted = posted ?? d.bouncePosted;
  note('bounce buffers posted per endpoint', bouncePosted, 'OFI_NCCL_RDMA_MIN_POSTED_EAGER_BUFFERS', posted !== undefined);

  const gdrOff = bool(env, 'OFI_NCCL_GDR_FLUSH_DISABLE') ?? false;
  const writeRead = bool(env, 'OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE') ?? false;
  const fRaw = env.TSNET_FLUSH;
  const f = fRaw === undefined || fRaw === '' ? 'auto' : fRaw.trim().toLowerCase();
  let flush: FlushMode;
  if (f === 'auto') flush = autoFlush(gdrOff, writeRead);
  else if (f === 'read' || f === 'write-read') flush = { method: f, all: true };
  else if (f === 'none') flush = { method: 'none', all: false };
  else throw invalidArgument(`TSNET_FLUSH=${fRaw}: expected auto, read, write-read or none`);
  const why = f !== 'auto' ? 'TSNET_FLUSH' : gdrOff ? 'OFI_NCCL_GDR_FLUSH_DISABLE' : writeRead ? 'OFI_NCCL_ENABLE_FLUSH_RDMA_WRITE' : '';
  const what = flush.method === 'none' ? 'none' : `${flush.method} of ${flush.all ? 'every' : 'GPU'} receive`;
  note('flush', what, why, why !== '');

  const ipc = bool(env, 'TSNET_OFI_GPU_IPC');
  const gpuIpc = ipc ?? d.gpuIpc;
  if (gpuIpc) note('GPU memory moved by CUDA IPC to peers in other processes (FI_HMEM_DEVICE_ONLY)', true, 'TSNET_OFI_GPU_IPC', true);

  const api = bool(env, 'TSNET_OFI_CUDA_API');
  const cudaApi = api ?? d.cudaApi;
  if (cudaApi) note('GPU memory even where libfabric calls CUDA on tsnet\'s threads (can deadlock)', true, 'TSNET_OFI_CUDA_API', true);

  const noDmabuf = bool(env, 'OFI_NCCL_DISABLE_DMABUF');
  const dmabuf = noDmabuf === undefined ? d.dmabuf : !noDmabuf;
  if (!dmabuf) note('DMA-BUF registration of GPU memory', 'off', 'OFI_NCCL_DISABLE_DMABUF', true);

  const sender = bool(env, 'TSNET_OFI_CHECK_SENDER');
  const checkSender = sender ?? d.checkSender;
  if (!checkSender) note('senders checked (FI_SOURCE)', false, 'TSNET_OFI_CHECK_SENDER', true);

  const bl = bool(env, 'TSNET_OFI_BELL');
  const bell = bl ?? d.bell;
  if (!bell) note('doorbells for endpoints without a wait fd', false, 'TSNET_OFI_BELL', true);

  const smallRailSet = sr !== undefined;
  return { config: { eagerMax, minStripe, smallRrMax, rrCtrl, smallRail, smallRailSet, forceRails, rails, bouncePosted, flush, gpuIpc, cudaApi, dmabuf, checkSender, bell }, lines };
}
