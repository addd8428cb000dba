/*
 * l_core.h - `mirza.core` and the bindings it is put together from (see
 * l_core.c); the context and the waits are l_wait.h's.
 */
#ifndef MIRZA_L_CORE_H
#define MIRZA_L_CORE_H

#include <lua.h>

#include "l_stream.h"
#include "l_wait.h"

int luaopen_mirza_core(lua_State *L);
int luaopen_mirza_json(lua_State *L);
int luaopen_mirza_proc(lua_State *L); /* adds spawn & co. to the table on top */
/* mirza.core.guard(thresholds): the repetition guard (l_guard.c). */
int mz_l_guard(lua_State *L);
/* mirza.core.idset(): a set of strings as 64-bit hashes (l_idset.c). */
int mz_l_idset(lua_State *L);

/* Add the OS and text helpers (stat, mkdir_p, isatty, fd_limit, platform,
 * redact_url, plain_remote, is_secret, on_warning) to the table on top
 * (l_os.c). */
void mz_l_os_funcs(lua_State *L);

#endif
