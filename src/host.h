/*
 * host.h - setting up a lua_State for mirza: standard libraries, the C
 * core and the Lua library in package.preload (embedded copies, or files
 * from a development directory for hacking and hot reload).
 */
#ifndef MIRZA_HOST_H
#define MIRZA_HOST_H

#include <lua.h>

/* Register mirza.core and the Lua modules in package.preload. dev_dir
 * (or $MIRZA_LUA_DIR when dev_dir is NULL): load mirza.* modules from
 * DIR/mirza/<name>.lua instead of the embedded copies. Raises on error. */
void mz_host_preload(lua_State *L, const char *dev_dir);

/* Message handler for lua_pcall, as lua.c's: the error (or its
 * __tostring, or a note on its type) with a traceback. */
int mz_host_msghandler(lua_State *L);

/* Registry key of the host's interrupt handler: a C function that
 * mz_l_raise_interrupt (l_core.c) calls before it raises "interrupted",
 * wherever the error comes from (the host's hook, a wait the signal cut
 * short). The `mirza` host (main.c) sets it: on a second signal it ends
 * the process there, which no pcall can catch. Under stock lua5.4 nothing
 * sets it, and "interrupted" is only an error. */
#define MZ_HOST_ON_INTERRUPT "mirza.on_interrupt"

/* Stop every process spawned in this state and not closed yet, as
 * lua_close would (each: SIGTERM, its grace, SIGKILL, its pid file
 * removed; keep_alive ones left running), all of them sent SIGTERM first
 * so their graces overlap (l_proc.c). For a host about to leave without
 * closing the state. */
void mz_l_stop_started(lua_State *L);

#endif
