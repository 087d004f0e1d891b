// The ABI definitions, for the plugin's own use.
export * from './versions';
export * from './ctypes';
export * from './constants';
export * from './callbacks';
export * from './structs';
export * from './properties';
export * from './table';
