// The endpoint's own registered host memory (4 KiB, on every NIC): where flush reads land,
// whence write-then-read flushes write, and the source and target of 0-byte operations.
export const LINE_BYTES = 4096;
/** Flush reads land at 64 x NIC. */
export const FLUSH_READ_AT = 0;
/** Write-then-read flushes write from 256 + 64 x NIC. */
export const FLUSH_SRC_AT = 256;
/** Host scratch for write-then-read without a device line: 512 + 64 x NIC. */
export const FLUSH_HOST_SCRATCH_AT = 512;
/** Source and target of 0-byte writes and messages. */
export const ZERO_AT = 1024;
/** Refusals of CONNECTs (an ACCEPT header with a status) in flight: 64 bytes each from here. */
export const REFUSAL_AT = 2048;
export const REFUSAL_SLOTS = 32;
