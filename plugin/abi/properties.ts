// ncclNetProperties_vN_t: one definition, members in C order, tagged with the
// versions that have them. codegen emits tsn_props_vN_t per version and the
// version-neutral tsn_props_t (every member, arrays at their largest length).
import type { CStr, F32, I16, I32, Size, U64 } from './ctypes';

/** A virtual device made of physical ones (v9+). @cname tsn_vprops @versions 9.. @field VPROPS */
export interface VirtualProps {
  /** Number of entries of devs in use. */
  ndevs: I32;
  /** Indices of the physical devices. @length 4 9..11 @length 8 12.. @countedBy ndevs */
  devs: I32[];
}

/** What a device reports to NCCL. @cname tsn_props @versions 6.. @fields */
export interface NetProperties {
  /** Device name; also NCCL's topology key, so unique per device. */
  name: CStr;
  /** Realpath of the NIC's /sys PCI device; null for a virtual NIC. */
  pciPath: CStr | null;
  /** Identifies the NIC chip: NCCL takes devices with one guid and port for ports of one NIC. */
  guid: U64;
  /** PtrKind bits the device can register. */
  ptrSupport: I32;
  /** A registration is not tied to one comm. @since 8 */
  regIsGlobal: I32;
  /** Flush every GPU receive. @since 9 */
  forceFlush: I32;
  /** Link speed in Mbps. */
  speed: I32;
  /** Port number. */
  port: I32;
  /** Latency in µs added to NCCL's estimate. */
  latency: F32;
  /** Caps the channels NCCL opens on this device. */
  maxComms: I32;
  /** Largest n in one irecv. */
  maxRecvs: I32;
  /** NetDeviceType of the device. @since 7 */
  netDeviceType: I32;
  /** Version of the device code. @since 7 */
  netDeviceVersion: I32;
  /** Physical devices behind this one: {1, {dev}} for a physical device. @since 9 */
  vProps: VirtualProps;
  /** Largest point-to-point transfer; > 0, at most 2^40. @since 9 */
  maxP2pBytes: Size;
  /** Largest collective transfer; > 0, at most 2^40. @since 9 */
  maxCollBytes: Size;
  /** Largest size of one multi-request. @since 11 */
  maxMultiRequestSize: I32;
  /** Rail of the device; -1 = unset. @since 12 */
  railId: I16;
  /** Plane of the device; -1 = unset. @since 12 */
  planeId: I16;
}
