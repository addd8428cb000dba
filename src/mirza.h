/*
 * mirza.h - names shared by the C files: version, metatable names, and the
 * error-token vocabulary used in `nil, message, code` triples.
 */
#ifndef MIRZA_H
#define MIRZA_H

#define MIRZA_VERSION "0.1.0"

/* Metatable names (luaL_newmetatable keys). */
#define MZ_STREAM_MT "mirza.Stream"
#define MZ_PROC_MT "mirza.Process"
#define MZ_BOX_MT "mirza.Box"

/* Error codes, the third value of a `nil, message, code` triple. */
#define MZ_E_REFUSED "refused"   /* connection refused / host unreachable */
#define MZ_E_TIMEOUT "timeout"   /* connect, stall or deadline */
#define MZ_E_HTTP "http"         /* HTTP status >= 400 */
#define MZ_E_CLOSED "closed"     /* stream cut without [DONE] */
#define MZ_E_PROTOCOL "protocol" /* malformed frame, oversized event */
#define MZ_E_SERVER "server"     /* error frame sent by the server */
#define MZ_E_IO "io"             /* other transport error */

#endif
