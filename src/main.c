/*
 * main.c - the `mirza` host, shaped like lua.c: everything runs in pmain
 * under lua_pcall with a traceback handler; `arg` is built like lua's;
 * SIGINT/SIGTERM raise "interrupted" at the next Lua instruction or wake a
 * wait in progress; they do not restart an interrupted system call, so a
 * script blocked elsewhere (io.read at a prompt) is stopped too. The error
 * is raised once, where the script is (a pcall may catch it: its <close>
 * variables and handlers clean up). When it ends the script, the state is
 * closed (closing every stream, which cancels its transfer, and stopping
 * started daemons), one line "interrupted" goes to stderr, and the exit
 * code is 130 (SIGINT) or 143 (SIGTERM). A second signal while the script
 * still runs ends the process at the next Lua instruction or wait, even
 * inside pcall: what the script wrote to files and pipes flushed first,
 * then started daemons stopped (mz_l_stop_started), "interrupted", exit
 * 130/143, the state left unclosed (the streams' sockets close with the
 * process). During the closing of the state it changes nothing (that
 * cleanup runs to its end); a third signal kills at once.
 *
 * Only reads are interrupted: a signal restarts a write (SA_RESTART), and
 * the script's reads (io.read, io.lines, file:read, file:lines) run without
 * it, so a read blocked at a prompt or on a pipe returns. stdio drops what
 * it had buffered when write(2) fails with EINTR: a signal that came while
 * the script wrote to a full pipe or a slow file would lose those bytes.
 *
 *   mirza [options] [script [args]]
 */
#include <lauxlib.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "host.h"
#include "l_core.h"
#include "l_util.h"
#include "mirza.h"
#include "repl.h"

static lua_State *globalL; /* for the signal handler only, as in lua.c */
static volatile sig_atomic_t signal_number, signal_count;
static int said_interrupted; /* the line "interrupted" is printed once */
static int reading;          /* reads in progress (interruptible), see reads_interrupted */

static const char usage_text[] = "usage: mirza [options] [script|job [args]]\n"
                                 "Run a Lua 5.4 script with the mirza library (require \"mirza\") built in;\n"
                                 "a job is a ready-made script run by name (listed below). With no script\n"
                                 "on a terminal, start an interactive prompt.\n"
                                 "Options:\n"
                                 "  -e CODE        execute the string CODE\n"
                                 "  -l NAME        require library NAME into global NAME\n"
                                 "  -i             enter the interactive prompt after the script (or -e)\n"
                                 "  -              execute standard input (stop handling options)\n"
                                 "  --             stop handling options\n"
                                 "  --lua-dir DIR  load the mirza.* Lua modules from DIR/mirza/ instead of the\n"
                                 "                 copies compiled into the binary (also: MIRZA_LUA_DIR=DIR)\n"
                                 "  -v, --version  print the version and exit\n"
                                 "  -h, --help     print this help and exit\n"
                                 "Exit status: 0 on success, 1 on an uncaught error (traceback on stderr),\n"
                                 "130 when interrupted by SIGINT, 143 by SIGTERM.\n";

static void say_interrupted(void) {
  if (!said_interrupted++) fputs("interrupted\n", stderr);
  fflush(stderr);
}

static void restart_writes(int restart);

/* The second signal: flush what the script wrote (first: stopping the
 * daemons takes their grace, and a third signal meanwhile kills), stop
 * the daemons it started, and leave without unwinding (no pcall can catch
 * it, no handler of the script runs). */
static _Noreturn void end_now(lua_State *L) {
  restart_writes(1); /* even when raised from inside a read */
  fflush(NULL);
  say_interrupted();
  mz_l_stop_started(L);
  fflush(NULL);
  _exit(128 + signal_number);
}

static void stop_hook(lua_State *L, lua_Debug *ar);

/* MZ_HOST_ON_INTERRUPT: called before each "interrupted" the library
 * raises. The first signal's error is raised once: a wait that raises it
 * takes the hook away, else a pcall around the wait would catch the error
 * and the hook raise it again right after. The count is read again after
 * the hook is gone: a second signal in between set its hook before. */
static int on_interrupt(lua_State *L) {
  if (signal_count >= 2) end_now(L);
  if (globalL && lua_gethook(globalL) == stop_hook) lua_sethook(globalL, NULL, 0, 0);
  if (signal_count >= 2) end_now(L);
  return 0;
}

/* Hook set by the signal handler: raise at the next Lua instruction. */
static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  mz_l_raise_interrupt(L); /* through on_interrupt */
}

static void on_signal(int sig) {
  int flag = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
  if (++signal_count >= 3) { /* the cleanup hangs: give up on it */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  if (!signal_number) signal_number = sig;
  if (globalL) lua_sethook(globalL, stop_hook, flag, 1);
  mz_l_signal(); /* wake a wait inside the client */
}

/* With SA_RESTART a write (a flush, a close) interrupted by the signal
 * goes on, nothing lost. */
static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
}

/* SA_RESTART on or off for our handler; without it (while the script
 * reads) a read blocked in the script (io.read) fails with EINTR instead
 * of waiting for its line, and the hook fires right after. Another
 * handler (the interactive prompt's) or the default action (after a third
 * signal) is left as it is. */
static void restart_writes(int restart) {
  static const int sigs[] = {SIGINT, SIGTERM};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction sa;
    if (sigaction(sigs[i], NULL, &sa) != 0 || sa.sa_handler != on_signal) continue;
    sa.sa_flags = restart ? sa.sa_flags | SA_RESTART : sa.sa_flags & ~SA_RESTART;
    sigaction(sigs[i], &sa, NULL);
  }
}

/* A read-side io function (upvalue 1) called without SA_RESTART; `lines`
 * (upvalue 2 true) returns its iterator wrapped the same way. */
static int interruptible(lua_State *L);

static void push_interruptible(lua_State *L, int is_lines) { /* [fn] -> [wrapped] */
  lua_pushboolean(L, is_lines);
  lua_pushcclosure(L, interruptible, 2);
}

/* Whether a read from the file handle at idx (a method's self) never
 * waits for input: a regular file (fstat once per handle, remembered in a
 * weak-keyed registry table). Such a read needs no toggling of SA_RESTART
 * (8 sigactions): a batch reads its input a line at a time. */
static int regular_file(lua_State *L, int idx) {
  luaL_Stream *p = luaL_testudata(L, idx, LUA_FILEHANDLE);
  if (!p || !p->f || !p->closef) return 0;
  mz_l_weak_table(L, "mirza.regular_files", "k");
  lua_pushvalue(L, idx);
  int known = lua_rawget(L, -2);
  int regular = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (known == LUA_TNIL) {
    struct stat st;
    regular = fstat(fileno(p->f), &st) == 0 && S_ISREG(st.st_mode);
    lua_pushvalue(L, idx);
    lua_pushboolean(L, regular);
    lua_rawset(L, -3);
  }
  lua_pop(L, 1);
  return regular;
}

static int interruptible(lua_State *L) {
  int n = lua_gettop(L);
  int toggle = !(n >= 1 && regular_file(L, 1));
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1); /* [fn, args...] */
  if (toggle && reading++ == 0) restart_writes(0);
  int status = lua_pcall(L, n, LUA_MULTRET, 0);
  if (toggle && --reading == 0) restart_writes(1);
  if (status != LUA_OK) return lua_error(L);
  if (lua_toboolean(L, lua_upvalueindex(2)) && lua_gettop(L) >= 1 && lua_iscfunction(L, 1)) {
    lua_pushvalue(L, 1);
    push_interruptible(L, 0);
    lua_replace(L, 1); /* [iter', nil, nil, file] */
  }
  return lua_gettop(L);
}

/* t[name] = interruptible(t[name]), t at the top of the stack. */
static void wrap_read(lua_State *L, const char *name) {
  if (lua_getfield(L, -1, name) != LUA_TFUNCTION) {
    lua_pop(L, 1);
    return;
  }
  push_interruptible(L, strcmp(name, "lines") == 0);
  lua_setfield(L, -2, name);
}

/* io.read, io.lines, and the files' read and lines: interruptible. */
static void reads_interrupted(lua_State *L) {
  int top = lua_gettop(L);
  if (lua_getglobal(L, "io") == LUA_TTABLE) { /* [io] */
    wrap_read(L, "read");
    wrap_read(L, "lines");
  }
  if (luaL_getmetatable(L, LUA_FILEHANDLE) == LUA_TTABLE && lua_getfield(L, -1, "__index") == LUA_TTABLE) {
    wrap_read(L, "read"); /* [io, mt, methods] */
    wrap_read(L, "lines");
  }
  lua_settop(L, top);
}

/* Call the function under the traceback handler; report errors. */
static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, mz_host_msghandler);
  lua_insert(L, base);
  int status = lua_pcall(L, narg, nres, base);
  lua_remove(L, base);
  return status;
}

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    if (signal_number) say_interrupted(); /* whatever the error says (EINTR, "interrupted") */
    else fprintf(stderr, "mirza: %s\n", msg ? msg : "(error object is not a string)");
    fflush(stderr);
    lua_pop(L, 1);
  }
  return status;
}

/* arg = {[-n..-1] = interpreter and options, [0] = script, [1..] = args} */
static void create_arg_table(lua_State *L, char **argv, int argc, int script) {
  int narg = argc - script - 1;
  lua_createtable(L, narg > 0 ? narg : 0, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

/* The script's directory goes first on package.path (and cpath). */
static void script_dir_first(lua_State *L, const char *script) {
  const char *slash = strrchr(script, '/');
  lua_getglobal(L, "package");
  if (slash) lua_pushlstring(L, script, (size_t)(slash - script));
  else lua_pushliteral(L, ".");
  const char *dir = lua_tostring(L, -1);
  lua_getfield(L, -2, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -4, "path");
  lua_pop(L, 3);
}

static int run_chunk(lua_State *L, int status, int nargs) {
  if (status == LUA_OK) { /* [chunk, args...] */
    status = docall(L, nargs, 0);
  } else {
    lua_pop(L, nargs);
  }
  return report(L, status);
}

static int run_script(lua_State *L, char **argv, int argc, int script) {
  const char *fname = argv[script];
  char job[4096]; // cppcheck-suppress variableScope ; fname may point into it until the load below
  if (strcmp(fname, "-") == 0) fname = NULL;
  else script_dir_first(L, fname = mz_cli_job(fname, argv[0], job, sizeof job));
  int status = luaL_loadfile(L, fname);
  int n = 0;
  for (int i = script + 1; i < argc; i++, n++) {
    luaL_checkstack(L, 1, "too many arguments to script");
    lua_pushstring(L, argv[i]);
  }
  return run_chunk(L, status, n);
}

static int dolibrary(lua_State *L, const char *name) {
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  int status = docall(L, 1, 1);
  if (status == LUA_OK) lua_setglobal(L, name);
  return report(L, status);
}

typedef struct opts {
  const char *dev_dir;
  int script; /* index of the script in argv, or 0 */
  int has_e;
  int interactive; /* -i, or the prompt started because stdin is a tty */
} opts;

/* First pass over argv: validate and find the script. Returns -1 on a
 * usage error, 1 for --help/--version (handled), 0 to run. */
static int parse_args(int argc, char **argv, opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || strcmp(a, "-") == 0) {
      o->script = i;
      return 0;
    }
    if (strcmp(a, "--") == 0) {
      o->script = i + 1 < argc ? i + 1 : 0;
      return 0;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return fputs(usage_text, stdout), mz_cli_help(stdout, argv[0]), 1;
    if (!strcmp(a, "-v") || !strcmp(a, "--version")) return mz_cli_version(stdout), 1;
    if (!strcmp(a, "-e") || !strcmp(a, "-l") || !strcmp(a, "--lua-dir")) {
      if (++i >= argc) return fprintf(stderr, "mirza: '%s' needs an argument\n%s", a, usage_text), -1;
      if (a[1] == 'e') o->has_e = 1;
      if (a[1] == '-') o->dev_dir = argv[i];
      continue;
    }
    if (!strcmp(a, "-i")) {
      o->interactive = 1;
      continue;
    }
    return fprintf(stderr, "mirza: unrecognized option '%s'\n%s", a, usage_text), -1;
  }
  return 0;
}

/* Second pass: run -e and -l in order. */
static int run_options(lua_State *L, char **argv, int last) {
  for (int i = 1; i < last; i++) {
    int status = LUA_OK;
    if (!strcmp(argv[i], "-e")) {
      status = luaL_loadbuffer(L, argv[i + 1], strlen(argv[i + 1]), "=(command line)");
      status = run_chunk(L, status, 0);
      i++;
    } else if (!strcmp(argv[i], "-l")) {
      status = dolibrary(L, argv[++i]);
    } else if (!strcmp(argv[i], "--lua-dir")) {
      i++;
    }
    if (status != LUA_OK) return status;
  }
  return LUA_OK;
}

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  opts *o = lua_touserdata(L, 3);
  lua_pushcfunction(L, on_interrupt);
  lua_setfield(L, LUA_REGISTRYINDEX, MZ_HOST_ON_INTERRUPT);
  luaL_openlibs(L);
  reads_interrupted(L);
  mz_host_preload(L, o->dev_dir);
  mz_repl_preload(L); /* mirza.readline, with readline */
  create_arg_table(L, argv, argc, o->script ? o->script : argc);
  int last = o->script ? o->script : argc;
  if (run_options(L, argv, last) != LUA_OK) return 0;
  if (o->script && run_script(L, argv, argc, o->script) != LUA_OK) return 0;
  if (o->interactive || (!o->script && !o->has_e && isatty(0))) {
    o->interactive = 1;
    if (mz_repl(L, &signal_number) != LUA_OK) return 0;
  } else if (!o->script && !o->has_e) {
    if (run_script(L, (char *[]){"-"}, 1, 0) != LUA_OK) return 0;
  }
  lua_pushboolean(L, 1);
  return 1;
}

int main(int argc, char **argv) {
  opts o = {0};
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc < 0 ? 1 : 0;
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "mirza: cannot create state: not enough memory\n");
    return 1;
  }
  globalL = L;
  catch_signals();
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  lua_pushlightuserdata(L, &o);
  int status = lua_pcall(L, 3, 1, 0);
  int ok = status == LUA_OK && lua_toboolean(L, -1);
  report(L, status);
  globalL = NULL;
  lua_close(L); /* closes streams (cancelling transfers) and daemons */
  if (signal_number || (!o.interactive && mz_l_was_interrupted()))
    return 128 + (signal_number ? signal_number : SIGINT);
  return ok ? 0 : 1;
}
