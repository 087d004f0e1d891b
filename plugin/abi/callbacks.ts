// Scalar and callback typedefs shared by NCCL and the plugin.
import type { ConstCStr, I32, I64, Ptr, ULong } from './ctypes';
import type { ResultCode } from './constants';

/** An ncclResult_t (a ResultCode). @cname tsn_result @ctype int */
export type Result = ResultCode;

/** NCCL's logger. @cname tsn_logger */
export type Logger = (level: I32, flags: ULong, file: ConstCStr, line: I32, fmt: ConstCStr, ...args: unknown[]) => void;

/** NCCL's profiler callback (v10+); may be NULL. @cname tsn_profiler */
export type Profiler = (eHandle: Ptr<Ptr<void>>, type: I32, phandle: Ptr<void>, pluginId: I64, extData: Ptr<void>) => Result;
