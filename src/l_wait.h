/*
 * l_wait.h - the per-lua_State context (one curl multi client), the
 * interrupt plumbing and the waits shared by the bindings and the host
 * (l_wait.c). The bindings of Lua-visible types (l_stream.c, l_proc.c...)
 * include this, not l_core.h: mirza.core is put together from them.
 */
#ifndef MIRZA_L_WAIT_H
#define MIRZA_L_WAIT_H

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

/* Add wait, sleep, now, streams, ready and task to the table on top. */
void mz_l_wait_funcs(lua_State *L);

#endif
