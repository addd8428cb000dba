/*
 * repl.h - the interactive prompt of `mirza` (no script on a terminal, or
 * -i), like lua's: `mirza` loaded, streams printed as they arrive, Ctrl-C
 * cancelling the running chunk rather than the session.
 */
#ifndef MIRZA_REPL_H
#define MIRZA_REPL_H

#include <lua.h>
#include <signal.h>

/* Read-eval-print until end of input, or until *quit becomes non-zero (a
 * terminating signal seen by the host). SIGINT is the REPL's meanwhile.
 * Returns LUA_OK, or the error status if `require "mirza"` failed. */
int mz_repl(lua_State *L, const volatile sig_atomic_t *quit);

/* Preload `mirza.readline` (the prompt's line editing for a script on a
 * terminal: read([prompt]) -> line | nil at the end of input) when the
 * build has readline; nothing otherwise. The host calls it after
 * mz_host_preload. */
void mz_repl_preload(lua_State *L);

#endif
