// C scalar and pointer types as TypeScript aliases: codegen maps each alias to its
// `@ctype`; the plugin uses the same names as ordinary TypeScript types.

/** C int16_t. @ctype int16_t @field I16 */
export type I16 = number;
/** C int. @ctype int @field I32 */
export type I32 = number;
/** C uint32_t. @ctype uint32_t */
export type U32 = number;
/** C int64_t. @ctype int64_t */
export type I64 = bigint;
/** C uint64_t. @ctype uint64_t @field U64 */
export type U64 = bigint;
/** C unsigned long (the logger's subsystem flags). @ctype unsigned long */
export type ULong = number;
/** C size_t. @ctype size_t @field SIZE */
export type Size = number;
/** C float. @ctype float @field F32 */
export type F32 = number;
/** C char*: a NUL-terminated string the plugin owns. @ctype char* @field STRING */
export type CStr = string;
/** C const char*: a NUL-terminated string. @ctype const char* */
export type ConstCStr = string;

/** A C pointer to T (`Ptr<void>` is void*): an address only the native layer dereferences. */
export type Ptr<T> = bigint & { readonly pointee?: T };
/** Marks the pointee of a Ptr as const in C (`Ptr<Const<Size>>` is const size_t*). */
export type Const<T> = T;
