// The libfabric transport's protocol (docs/rdma-protocol.md): one OfiEndpoint per device and
// protocol thread over that device's rails; listen/connect give comms.
export { OfiConnector, OfiListener } from './connect';
export { type EndpointOptions, OfiEndpoint } from './endpoint';
export type * from './fabric';
export { type OfiConfig, OFI_DEFAULTS, readOfiConfig } from './config';
