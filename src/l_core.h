/*
 * l_core.h - the per-lua_State context (one curl multi client) and the
 * interrupt plumbing shared by the bindings and the host.
 */
#ifndef MIRZA_L_CORE_H
#define MIRZA_L_CORE_H

#include <lua.h>
#include <signal.h>

#include "client.h"

/* Strings every token event uses, made once per state (registry refs), so
 * the event is built with lua_rawgeti + lua_rawset instead of the string
 * lookup lua_pushstring and lua_setfield do at each call. */
enum { MZ_STR_TEXT, MZ_STR_TYPE, MZ_STR_THINK, MZ_STR_DELTAS, MZ_STR_INDEX, MZ_STR_N };

typedef struct mz_ctx {
  mz_client *client; /* NULL once the state is closing */
  int str[MZ_STR_N]; /* registry refs, see MZ_STR_* */
  int warned_plain;  /* the clear-text credential warning was given */
  int in_task;       /* a scheduler is resuming a task (mirza.core.task) */
  long slice;        /* events the task took in a row without waiting */
  long slice_max;    /* ... before it lets the other tasks run */
} mz_ctx;

/* The context of L's main state, created on first use. Pushes nothing. */
mz_ctx *mz_l_ctx(lua_State *L);
/* Push the context userdata (to anchor it in a uservalue). */
void mz_l_pushctx(lua_State *L);

/* Inside a scheduler's task that can yield to it: the core's pulls and
 * sleep then hand their waits to the scheduler's hook instead of
 * blocking (one load and a branch on every pull outside tasks). */
static inline int mz_l_in_task(lua_State *L, const mz_ctx *ctx) { return ctx->in_task && lua_isyieldable(L); }
/* Push the hook of the scheduler (mirza.core.task); returns its type
 * (LUA_TFUNCTION, or LUA_TNIL when no scheduler ever ran a task). */
int mz_l_push_hook(lua_State *L);

/* Async-signal-safe: flag an interrupt and wake any wait in progress. */
void mz_l_signal(void);
/* 1 if an interrupt was signalled since start (the host's exit code). */
int mz_l_was_interrupted(void);
/* Raise the "interrupted" error (clears the pending flag first). */
int mz_l_raise_interrupt(lua_State *L);
/* After a wait returned MZ_NEXT_SIGNAL: let the interpreter's own signal
 * hook run (stock lua5.4 raises "interrupted!"); returns if none raised. */
void mz_l_after_signal(lua_State *L);
/* Deadlines of waits that restart after a signal: the end (mz_now()
 * seconds, INFINITY for ms < 0) and the milliseconds left (-1: forever). */
double mz_l_end_of(long ms);
long mz_l_left_ms(double end);

/* A warning for the user: to the handler set with mirza.on_warning, else
 * "mirza: warning: MSG" on stderr. Never raises. */
void mz_l_warn(lua_State *L, const char *msg);

/* Register the Stream userdata at idx as the Lua face of s (mirza.ready). */
void mz_l_stream_opened(lua_State *L, mz_stream *s, int idx);

int luaopen_mirza_core(lua_State *L);
int luaopen_mirza_stream(lua_State *L); /* registers the Stream metatable; pushes defaults, open */
int luaopen_mirza_json(lua_State *L);
int luaopen_mirza_proc(lua_State *L); /* adds spawn & co. to the table on top */
/* mirza.core.guard(thresholds): the repetition guard (l_guard.c). */
int mz_l_guard(lua_State *L);
/* mirza.core.idset(): a set of strings as 64-bit hashes (l_idset.c). */
int mz_l_idset(lua_State *L);

#endif
