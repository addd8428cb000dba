/*
 * repl.c - `mirza` with no script on a terminal (or with -i): an
 * interactive Lua prompt with `mirza` loaded, shaped like lua.c's doREPL.
 * A line is tried as an expression first ("return " .. line), then as a
 * statement; an incomplete chunk asks for more lines. Results are printed
 * with print(), except a mirza.Stream, whose text is printed as it
 * arrives (thinking on stderr) until its final event.
 *
 * SIGINT belongs to the REPL while it runs: at the prompt it discards the
 * line; during a chunk it raises "interrupted" at the next Lua instruction
 * and wakes a wait in progress, so a stream being read is closed (its
 * transfer cancelled) by the error unwinding, and the session goes on.
 * Any other terminating signal (main.c's handler, which sets *quit) ends
 * the session.
 *
 * Line editing and history come from GNU readline when the build found it
 * (MIRZA_HAVE_READLINE), through its callback interface so that the wait for a
 * key is our own select() and a signal interrupts it cleanly.
 */
#include "repl.h"

#include <errno.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#ifdef MIRZA_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#include "cli.h"
#include "host.h"
#include "l_core.h"
#include "mirza.h"

#define PROMPT "> "
#define PROMPT2 ">> "
#define EOFMARK "<eof>"

enum { LINE_OK, LINE_EOF, LINE_CANCEL };

/* What the SIGINT handler must reach: the state, and two flags. */
static lua_State *repl_state;
static volatile sig_atomic_t running, cancelled;

static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  mz_l_raise_interrupt(L);
}

static void on_sigint(int sig) {
  (void)sig;
  cancelled = 1;
  if (running) {
    lua_sethook(repl_state, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
    mz_l_signal(); /* wake a wait inside the client */
  }
}

/* Block until stdin is readable: 0, or -1 when a signal came first. */
static int wait_stdin(void) {
  fd_set in;
  FD_ZERO(&in);
  FD_SET(0, &in);
  return select(1, &in, NULL, NULL, NULL) < 0 && errno == EINTR ? -1 : 0;
}

#ifdef MIRZA_HAVE_READLINE
static char *line_read;
static int line_done;

static void on_line(char *line) {
  line_read = line;
  line_done = 1;
  rl_callback_handler_remove(); /* the prompt is not shown again */
}

/* The line in progress dropped and the terminal restored: a cancel (the
 * REPL's read_line, a script's mirza.readline). */
static void drop_line(void) {
  rl_free_line_state();
#ifdef MIRZA_HAVE_RL_SIGCLEANUP
  rl_callback_sigcleanup();
#endif
  rl_cleanup_after_signal();
  rl_callback_handler_remove();
  fputs("\n", stdout);
  fflush(stdout);
}

/* Read one line with readline; *out is malloc'ed (or NULL at EOF). */
static int read_line(const char *prompt, char **out, const volatile sig_atomic_t *quit) {
  line_done = 0;
  line_read = NULL;
  rl_callback_handler_install(prompt, on_line);
  while (!line_done) {
    int ready = wait_stdin() == 0;
    if (cancelled || *quit) { /* even if a key came too: drop the line, as bash does */
      drop_line();
      return LINE_CANCEL;
    }
    if (ready) rl_callback_read_char();
  }
  if (line_read && *line_read) add_history(line_read);
  *out = line_read;
  return line_read ? LINE_OK : LINE_EOF;
}
#else
/* Read one line byte by byte (a terminal delivers whole lines anyway). */
static int read_line(const char *prompt, char **out, const volatile sig_atomic_t *quit) {
  size_t len = 0, cap = 128;
  char *buf = malloc(cap), c;
  if (!buf) return LINE_EOF;
  fputs(prompt, stdout);
  fflush(stdout);
  for (;;) {
    int ready = wait_stdin() == 0;
    if (cancelled || *quit) {
      free(buf);
      fputs("\n", stdout);
      return LINE_CANCEL;
    }
    if (!ready) continue;
    ssize_t n = read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 && len == 0) return free(buf), LINE_EOF;
    if (n <= 0 || c == '\n') break;
    if (len + 1 >= cap) {
      char *grown = realloc(buf, cap *= 2);
      if (!grown) return free(buf), LINE_EOF;
      buf = grown;
    }
    buf[len++] = c;
  }
  buf[len] = '\0';
  *out = buf;
  return LINE_OK;
}
#endif

/* Clears the client's pending-interrupt flag (it raises by design). */
static int clear_interrupt(lua_State *L) { return mz_l_raise_interrupt(L); }

/* Run the function on top with its arguments under the traceback handler,
 * with SIGINT armed to cancel it. Leaves the results or the message. */
static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, mz_host_msghandler);
  lua_insert(L, base);
  cancelled = 0;
  running = 1;
  int status = lua_pcall(L, narg, nres, base);
  running = 0;
  lua_sethook(L, NULL, 0, 0);
  lua_remove(L, base);
  if (cancelled) { /* the flag may be left set if nothing waited */
    lua_pushcfunction(L, clear_interrupt);
    lua_pcall(L, 0, 0, 0);
    lua_pop(L, 1);
  }
  return status;
}

static void report(lua_State *L, int status) {
  if (status == LUA_OK) return;
  const char *msg = lua_tostring(L, -1);
  if (cancelled && msg && strstr(msg, "interrupted")) msg = "interrupted";
  fprintf(stderr, "%s\n", msg ? msg : "(error object is not a string)");
  fflush(stderr);
  lua_pop(L, 1);
}

/* A stream printed as it arrives: text on stdout, thinking on stderr,
 * then the finish reason (or the error). Runs under docall, so Ctrl-C
 * raises inside the loop and the loop's closing value cancels it. */
static const char drain_src[] =
    "local s = ...\n"
    "local out, err = io.stdout, io.stderr\n"
    "for ev in s:events() do\n"
    "  local t = ev.type\n"
    "  if t == 'text' then out:write(ev.text); out:flush()\n"
    "  elseif t == 'think' then err:write(ev.text); err:flush()\n"
    "  elseif t == 'done' then\n"
    "    local u = ev.usage and ev.usage.completion_tokens\n"
    "    out:write('\\n[', tostring(ev.finish_reason), u and (', ' .. u .. ' tokens') or '', ']\\n')\n"
    "  elseif t == 'error' then\n"
    "    out:write('\\n'); err:write('[error ', tostring(ev.code), '] ', tostring(ev.message), '\\n')\n"
    "  end\n"
    "end\n";

/* Print the n results on top (a lone stream is drained), then pop them. */
static void print_results(lua_State *L, int n) {
  int status = LUA_OK;
  if (n == 1 && luaL_testudata(L, -1, MZ_STREAM_MT)) {
    luaL_loadbuffer(L, drain_src, sizeof drain_src - 1, "=(stream printer)");
    lua_insert(L, -2); /* [drain, stream] */
    status = docall(L, 1, 0);
  } else if (n > 0) {
    lua_getglobal(L, "print");
    lua_insert(L, -n - 1); /* [print, results...] */
    status = docall(L, n, 0);
  }
  report(L, status);
}

/* Did the chunk fail only for lack of its end (more lines to come)? */
static int incomplete(lua_State *L, int status) {
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  return status == LUA_ERRSYNTAX && msg && len >= sizeof EOFMARK - 1 &&
         strcmp(msg + len - (sizeof EOFMARK - 1), EOFMARK) == 0;
}

/* Compile the line as an expression, else as statements reading more
 * lines while incomplete. Pushes the chunk or the error; returns a
 * LINE_* code other than LINE_OK when input ended or was cancelled. */
static int compile(lua_State *L, char *line, int *status, const volatile sig_atomic_t *quit) {
  lua_pushfstring(L, "return %s;", line);
  *status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=stdin");
  lua_remove(L, -2);
  if (*status == LUA_OK) return free(line), LINE_OK;
  lua_pop(L, 1);
  lua_pushstring(L, line); /* [buffer] */
  free(line);
  for (;;) {
    *status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=stdin");
    if (!incomplete(L, *status)) break;
    lua_pop(L, 1);
    char *more;
    int got = read_line(PROMPT2, &more, quit);
    if (got != LINE_OK) return lua_pop(L, 1), got;
    lua_pushfstring(L, "%s\n%s", lua_tostring(L, -1), more);
    free(more);
    lua_remove(L, -2);
  }
  lua_remove(L, -2); /* [chunk or message] */
  return LINE_OK;
}

/* One prompt: read, compile, run, print. 0 to go on, -1 at the end. */
static int step(lua_State *L, const volatile sig_atomic_t *quit) {
  char *line;
  int status, top = lua_gettop(L);
  cancelled = 0;
  int got = read_line(PROMPT, &line, quit);
  if (got == LINE_OK) got = compile(L, line, &status, quit);
  if (got == LINE_EOF) return -1;
  if (got == LINE_CANCEL) return 0;
  if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
  if (status == LUA_OK) print_results(L, lua_gettop(L) - top);
  else report(L, status);
  return 0;
}

int mz_repl(lua_State *L, const volatile sig_atomic_t *quit) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART; /* select() is interrupted anyway */
  sigemptyset(&sa.sa_mask);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "mirza");
  int status = docall(L, 1, 1);
  if (status != LUA_OK) return report(L, status), status;
  lua_setglobal(L, "mirza");
  setvbuf(stdout, NULL, _IONBF, 0); /* io.write shows at once */
#ifdef MIRZA_HAVE_READLINE
  rl_readline_name = "mirza";
#ifdef MIRZA_HAVE_RL_SIGCLEANUP /* GNU readline (macOS libedit has no such switch) */
  rl_catch_signals = 0;         /* SIGINT is ours: see read_line */
#endif
#endif
  mz_cli_version(stdout);
  fputs("`mirza` is loaded; a stream value prints as it arrives, Ctrl-C cancels it, Ctrl-D quits.\n", stdout);
  repl_state = L;
  sigaction(SIGINT, &sa, &old);
  int top = lua_gettop(L);
  while (!*quit && step(L, quit) == 0) lua_settop(L, top);
  sigaction(SIGINT, &old, NULL);
  repl_state = NULL;
  if (!*quit) fputs("\n", stdout);
  return LUA_OK;
}

/* ------------------------------------------------------------ mirza.readline
 * The prompt's line editing for a script on a terminal (mirza chat):
 * `require("mirza.readline").read([prompt])` -> the line, or nil at the end
 * of input; a line that is not empty goes to the history. Only the `mirza`
 * host built with readline has the module (mz_repl_preload), so a script
 * falls back on io.read where `require` fails. The script's signals are the
 * host's (main.c), not the REPL's: a Ctrl-C while it waits for a key drops
 * the line, gives the terminal back and raises "interrupted" here. */
#ifdef MIRZA_HAVE_READLINE
static int l_readline_read(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "");
  fflush(stdout);
  line_done = 0;
  line_read = NULL;
  rl_callback_handler_install(prompt, on_line);
  while (!line_done) {
    if (wait_stdin() < 0) { /* a signal: Ctrl-C or SIGTERM raise, another one (SIGWINCH) does not */
      if (!mz_l_was_interrupted()) continue;
      drop_line();
      return mz_l_raise_interrupt(L);
    }
    rl_callback_read_char();
  }
  if (!line_read) return lua_pushnil(L), 1; /* end of input */
  if (*line_read) add_history(line_read);
  lua_pushstring(L, line_read);
  free(line_read);
  line_read = NULL;
  return 1;
}

static int luaopen_mirza_readline(lua_State *L) {
  static const luaL_Reg funcs[] = {{"read", l_readline_read}, {NULL, NULL}};
  luaL_newlib(L, funcs);
  return 1;
}
#endif

void mz_repl_preload(lua_State *L) {
#ifdef MIRZA_HAVE_READLINE
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE); /* [preload] */
  lua_pushcfunction(L, luaopen_mirza_readline);
  lua_setfield(L, -2, "mirza.readline");
  lua_pop(L, 1);
#else
  (void)L;
#endif
}
