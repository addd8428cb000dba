/*
 * l_proc.c - the mirza.Process userdata over supervisor.c's mz_proc, and
 * the plain functions that manage daemons we did not start (adopted ones):
 * stop by pid, liveness, per-port pid files, the tail of a log.
 *
 * Built like liolib's files: spawn{...} creates the userdata closed, then
 * starts the child, so an error in between leaks nothing. close(), __close
 * and __gc are one idempotent function: it stops the process group
 * (SIGTERM, grace, SIGKILL) unless the process was spawned keep_alive, and
 * frees the handle. A process not closed yet is anchored in the registry,
 * so dropping its handle does not stop it at the next collection. The host closes the Lua state on a normal end, an
 * uncaught error and SIGINT/SIGTERM, so every spawned daemon is stopped in
 * all three cases; on a second signal it leaves without closing the state,
 * after mz_l_stop_started; SIGKILL of mirza is covered by the spawn's
 * guard (os.h: PDEATHSIG, or a watchdog that waits the same grace).
 *
 * Expected failures (cannot exec, pid file not writable) return
 * `nil, message, code`; bad arguments raise.
 */
#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "host.h"
#include "l_core.h"
#include "l_util.h"
#include "mirza.h"
#include "supervisor.h"

#define E_SPAWN "spawn"       /* code of a failed spawn */
#define DEFAULT_GRACE_MS 5000 /* SIGTERM -> SIGKILL delay on close */
#define DEFAULT_TAIL_LINES 20
#define TAIL_BYTES 16384            /* log_tail/file_tail return at most this */
#define LIVE_KEY "mirza.live_procs" /* registry: spawned processes not closed yet */

typedef struct lproc {
  mz_proc *p;     /* NULL when closed */
  long pid;       /* kept after close, for __tostring */
  int keep_alive; /* close() leaves the child running */
  int grace_ms;   /* grace used by close() */
  int pidfile;    /* port whose pid file names this child, or 0 */
} lproc;          /* uservalue 1: the log path, or nil */

static lproc *to_proc(lua_State *L, int idx) { return luaL_checkudata(L, idx, MZ_PROC_MT); }

static lproc *check_proc(lua_State *L, int idx) {
  lproc *u = to_proc(L, idx);
  if (!u->p) luaL_error(L, "attempt to use a closed process");
  return u;
}

/* Seconds (optional, >= 0) at idx as milliseconds; def when absent. */
static int opt_grace(lua_State *L, int idx, int def) {
  if (lua_isnoneornil(L, idx)) return def;
  lua_Number s = luaL_checknumber(L, idx);
  luaL_argcheck(L, s >= 0 && s < 1e6, idx, "grace must be 0..1e6 seconds");
  return (int)(s * 1000.0 + 0.5);
}

/* Push the description of a wait status, the exit code (or nil) and the
 * signal number (or nil). Returns 3. */
static int push_status(lua_State *L, int st) {
  char buf[128];
  lua_pushstring(L, mz_status_describe(st, buf, sizeof buf));
  if (WIFEXITED(st)) lua_pushinteger(L, WEXITSTATUS(st));
  else lua_pushnil(L);
  if (WIFSIGNALED(st)) lua_pushinteger(L, WTERMSIG(st));
  else lua_pushnil(L);
  return 3;
}

/* The last n lines of path (at most TAIL_BYTES) as a Lua string. */
static void push_tail(lua_State *L, const char *path, int n) {
  luaL_Buffer b;
  char *buf = luaL_buffinitsize(L, &b, TAIL_BYTES);
  if (path) mz_file_tail(path, n, buf, TAIL_BYTES);
  else buf[0] = '\0';
  luaL_pushresultsize(&b, strlen(buf));
}

/* ------------------------------------------------------------ methods */

static int p_pid(lua_State *L) {
  lua_pushinteger(L, mz_proc_pid(check_proc(L, 1)->p));
  return 1;
}

/* p:poll() -> true | false, status_text, exit_code?, signal? (never blocks) */
static int p_poll(lua_State *L) {
  int st = 0;
  lproc *u = check_proc(L, 1);
  if (!mz_proc_poll(u->p, &st)) {
    lua_pushboolean(L, 1);
    return 1;
  }
  lua_pushboolean(L, 0);
  return 1 + push_status(L, st);
}

/* p:stop([grace]) -> killed, status_text, exit_code?, signal?
 * SIGTERM to the group, grace seconds, SIGKILL. Idempotent. */
static int p_stop(lua_State *L) {
  int st = 0;
  lproc *u = check_proc(L, 1);
  int killed = mz_proc_stop(u->p, opt_grace(L, 2, u->grace_ms));
  mz_proc_poll(u->p, &st);
  lua_pushboolean(L, killed);
  return 1 + push_status(L, st);
}

/* p:log_tail([n]) -> the last n (default 20) lines of the log, or "". */
static int p_log_tail(lua_State *L) {
  check_proc(L, 1);
  int n = (int)luaL_optinteger(L, 2, DEFAULT_TAIL_LINES);
  lua_getiuservalue(L, 1, 1); /* [p, n?, log] */
  push_tail(L, lua_tostring(L, -1), n);
  return 1;
}

static int p_log_path(lua_State *L) {
  check_proc(L, 1);
  lua_getiuservalue(L, 1, 1);
  return 1;
}

/* The registry's set of running processes, pushed. A spawned process is
 * anchored there until close(): a daemon must live until it is stopped,
 * closed or the state ends, not until its handle becomes garbage (the
 * finalizer then only runs at lua_close, which finalizes everything). */
static void push_live(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, LIVE_KEY) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, LIVE_KEY);
}

/* live[value at idx] = on (true) or nil. */
static void set_live(lua_State *L, int idx, int on) {
  idx = lua_absindex(L, idx);
  push_live(L);
  lua_pushvalue(L, idx);
  if (on) lua_pushboolean(L, 1);
  else lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* close, __close and __gc: stop unless keep_alive, then free. Safe to
 * call again, and from a finalizer at lua_close. */
static int p_close(lua_State *L) {
  lproc *u = to_proc(L, 1);
  if (u->p) {
    set_live(L, 1, 0);
    if (!u->keep_alive) {
      mz_proc_stop(u->p, u->grace_ms);
      /* a pid file naming a stopped child would let its recycled pid be
       * adopted later: it goes with the child (a keep_alive one keeps it) */
      if (u->pidfile && mz_pidfile_read(u->pidfile) == (pid_t)u->pid) mz_pidfile_remove(u->pidfile);
    }
    mz_proc_free(u->p);
    u->p = NULL;
  }
  return 0;
}

/* host.h: every live process gets SIGTERM (pass 0), then each is closed
 * (pass 1: its grace, SIGKILL, pid file), as lua_close would. */
void mz_l_stop_started(lua_State *L) {
  push_live(L); /* [live] */
  for (int pass = 0; pass < 2; pass++) {
    lua_pushnil(L);
    while (lua_next(L, -2)) { /* [live, proc, true] */
      lproc *u = luaL_testudata(L, -2, MZ_PROC_MT);
      lua_pop(L, 1);
      if (!u || !u->p) continue;
      if (pass == 0 && !u->keep_alive) mz_proc_term(u->p);
      if (pass == 0) continue;
      lua_pushcfunction(L, p_close); /* clearing its entry: allowed during lua_next */
      lua_pushvalue(L, -2);
      lua_call(L, 1, 0);
    }
  }
  lua_pop(L, 1);
}

static int p_closed(lua_State *L) {
  lua_pushboolean(L, to_proc(L, 1)->p == NULL);
  return 1;
}

static int p_tostring(lua_State *L) {
  lproc *u = to_proc(L, 1);
  if (u->p) lua_pushfstring(L, "mirza.Process (pid %I)", (lua_Integer)u->pid);
  else lua_pushliteral(L, "mirza.Process (closed)");
  return 1;
}

/* ------------------------------------------------------------ spawn */

static const char *const spawn_keys[] = {"argv", "env", "cwd", "log", "keep_alive", "grace", "pidfile", NULL};

static const mz_l_option spawn_grace = {"mirza.spawn", "grace", "a number of seconds 0..1e6", 0, 1e6, 0};
static const mz_l_option spawn_pidfile = {"mirza.spawn", "pidfile", "a port 1..65535", 1, 65535, 1};

/* opts[k] as a string or NULL; it stays referenced by the opts table. */
static const char *field_str(lua_State *L, int idx, const char *k) {
  int t = lua_getfield(L, idx, k);
  if (t != LUA_TNIL && t != LUA_TSTRING) luaL_error(L, "mirza.spawn: '%s' must be a string", k);
  const char *s = lua_tostring(L, -1);
  lua_pop(L, 1);
  return s;
}

/* opts.argv as a NULL-terminated array in a userdata. Pushes the argv
 * table and the array; the strings are anchored by the table. Only real
 * strings: converting a number in place would leave a dangling pointer. */
static const char **push_argv(lua_State *L, int idx) {
  if (lua_getfield(L, idx, "argv") != LUA_TTABLE) luaL_error(L, "mirza.spawn: 'argv' must be a table of strings");
  lua_Integer n = luaL_len(L, -1);
  if (n < 1 || n > 100000) luaL_error(L, "mirza.spawn: 'argv' must hold 1 to 100000 strings");
  const char **arr = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0); /* [argv, arr] */
  for (lua_Integer i = 1; i <= n; i++) {
    if (lua_geti(L, -2, i) != LUA_TSTRING) luaL_error(L, "mirza.spawn: argv[%d] must be a string", (int)i);
    arr[i - 1] = lua_tostring(L, -1);
    lua_pop(L, 1);
  }
  arr[n] = NULL;
  return arr;
}

/* Add one env entry (value on top, key below) as "NAME=value" to anchors. */
static void env_entry(lua_State *L, int anchors, int n) {
  if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "mirza.spawn: env values must be strings");
  if (lua_type(L, -2) == LUA_TSTRING) lua_pushfstring(L, "%s=%s", lua_tostring(L, -2), lua_tostring(L, -1));
  else lua_pushvalue(L, -1);
  if (!strchr(lua_tostring(L, -1), '=')) luaL_error(L, "mirza.spawn: env entry without '=': %s", lua_tostring(L, -1));
  lua_rawseti(L, anchors, n);
}

/* opts.env ({NAME = "v"} or {"NAME=v"}) as a NULL-terminated array, or
 * NULL. Pushes the source table, an anchor table and the array (or nil). */
static const char **push_env(lua_State *L, int idx) {
  int t = lua_getfield(L, idx, "env");
  if (t == LUA_TNIL) return NULL;
  if (t != LUA_TTABLE) luaL_error(L, "mirza.spawn: 'env' must be a table");
  int src = lua_gettop(L), n = 0;
  lua_newtable(L); /* [env, anchors] */
  lua_pushnil(L);
  while (lua_next(L, src)) { /* [env, anchors, key, value] */
    env_entry(L, src + 1, ++n);
    lua_pop(L, 1);
  }
  return mz_l_strarray(L, src + 1, n); /* [src, anchors, array] */
}

/*
 * mirza.core.spawn{argv = {...}, env = {...}, cwd = , log = , keep_alive = ,
 * grace = , pidfile = port} -> proc | nil, message, "spawn"
 * The program is looked up in PATH, never run through a shell. With
 * pidfile, the child's pid is written to that port's pid file (best
 * effort) and removed again when close() stops the child.
 */
static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  mz_l_check_keys(L, 1, spawn_keys, "mirza.spawn");
  lproc *u = lua_newuserdatauv(L, sizeof *u, 1); /* [opts, u] created closed */
  memset(u, 0, sizeof *u);
  luaL_setmetatable(L, MZ_PROC_MT);
  mz_spawn_opts o = {0};
  o.cwd = field_str(L, 1, "cwd");
  o.log_path = field_str(L, 1, "log");
  lua_getfield(L, 1, "log");
  lua_setiuservalue(L, 2, 1);
  lua_getfield(L, 1, "keep_alive");
  o.keep_alive = u->keep_alive = lua_toboolean(L, -1);
  lua_pop(L, 1);
  o.grace_ms = u->grace_ms = (int)(mz_l_opt_field(L, 1, &spawn_grace, DEFAULT_GRACE_MS / 1000.0) * 1000.0 + 0.5);
  u->pidfile = (int)mz_l_opt_field(L, 1, &spawn_pidfile, 0);
  o.argv = push_argv(L, 1);
  o.env = push_env(L, 1);
  char err[512];
  mz_proc *p;
  if (mz_proc_spawn(&o, &p, err, sizeof err) < 0) return mz_l_fail(L, err, E_SPAWN);
  u->p = p;
  u->pid = (long)mz_proc_pid(p);
  lua_settop(L, 2);
  set_live(L, 2, 1);
  if (u->pidfile) mz_pidfile_write(u->pidfile, (pid_t)u->pid); /* best effort: adoption is a bonus */
  return 1;
}

/* ------------------------------------------------------------ adopted daemons */

static pid_t check_pid(lua_State *L, int idx) {
  lua_Integer pid = luaL_checkinteger(L, idx);
  luaL_argcheck(L, pid > 0 && pid <= INT_MAX, idx, "pid out of range");
  return (pid_t)pid;
}

static int check_port(lua_State *L, int idx) {
  lua_Integer port = luaL_checkinteger(L, idx);
  luaL_argcheck(L, port >= 0 && port <= 65535, idx, "port out of range");
  return (int)port;
}

static int fail_errno(lua_State *L, const char *what, lua_Integer n) {
  return mz_l_failf(L, MZ_E_IO, "%s %I: %s", what, n, strerror(errno));
}

/* pid_stop(pid, [grace]) -> true | nil, message, "io" */
static int l_pid_stop(lua_State *L) {
  pid_t pid = check_pid(L, 1);
  if (mz_pid_stop(pid, opt_grace(L, 2, DEFAULT_GRACE_MS)) < 0) return fail_errno(L, "cannot stop pid", pid);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pid_alive(lua_State *L) {
  lua_pushboolean(L, mz_pid_alive(check_pid(L, 1)));
  return 1;
}

/* pid_listens(pid, port) -> boolean | nil, message, "io"
 * Whether pid holds the socket listening on port (see supervisor.h). */
static int l_pid_listens(lua_State *L) {
  pid_t pid = check_pid(L, 1);
  int port = check_port(L, 2);
  int r = mz_pid_listens(pid, port);
  if (r < 0 && errno == ENOSYS)
    return mz_l_failf(L, MZ_E_IO, "this build of mirza cannot tell which process listens on a port (%s)",
                      "a portable build: no /proc, no libproc");
  if (r < 0) return fail_errno(L, "cannot inspect the sockets of pid", pid);
  lua_pushboolean(L, r);
  return 1;
}

/* pidfile_read(port) -> pid | nil (no file, unreadable, unsafe directory) */
static int l_pidfile_read(lua_State *L) {
  pid_t pid = mz_pidfile_read(check_port(L, 1));
  if (pid > 0) lua_pushinteger(L, pid);
  else lua_pushnil(L);
  return 1;
}

static int l_pidfile_write(lua_State *L) {
  int port = check_port(L, 1);
  if (mz_pidfile_write(port, check_pid(L, 2)) < 0) return fail_errno(L, "cannot write the pid file of port", port);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pidfile_remove(lua_State *L) {
  int port = check_port(L, 1);
  if (mz_pidfile_remove(port) < 0) return fail_errno(L, "cannot remove the pid file of port", port);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pidfile_path(lua_State *L) {
  char buf[PATH_MAX];
  int port = check_port(L, 1);
  if (!mz_pidfile_path(port, buf, sizeof buf)) return fail_errno(L, "no pid file path for port", port);
  lua_pushstring(L, buf);
  return 1;
}

/* runtime_dir() -> the directory of the pid files, created 0700 (daemon
 * logs go there too) | nil, message, "io" */
static int l_runtime_dir(lua_State *L) {
  char buf[PATH_MAX];
  if (!mz_pidfile_path(0, buf, sizeof buf)) return fail_errno(L, "no runtime directory for port", 0);
  char *slash = strrchr(buf, '/');
  if (slash && slash != buf) *slash = '\0';
  if (mz_mkdir_p(buf) < 0) return mz_l_failf(L, MZ_E_IO, "cannot create %s: %s", buf, strerror(errno));
  lua_pushstring(L, buf);
  return 1;
}

/* file_tail(path, [n]) -> the last n (default 20) lines, "" when missing */
static int l_file_tail(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  push_tail(L, path, (int)luaL_optinteger(L, 2, DEFAULT_TAIL_LINES));
  return 1;
}

/* Registers the Process metatable and adds spawn and the adopted-daemon
 * functions to the table on top of the stack (mirza.core). Pushes
 * nothing. */
int luaopen_mirza_proc(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"pid", p_pid},           {"poll", p_poll},   {"stop", p_stop},     {"log_tail", p_log_tail},
      {"log_path", p_log_path}, {"close", p_close}, {"closed", p_closed}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", p_close}, {"__close", p_close}, {"__tostring", p_tostring}, {NULL, NULL}};
  static const luaL_Reg funcs[] = {{"spawn", l_spawn},
                                   {"pid_stop", l_pid_stop},
                                   {"pid_alive", l_pid_alive},
                                   {"pid_listens", l_pid_listens},
                                   {"pidfile_read", l_pidfile_read},
                                   {"pidfile_write", l_pidfile_write},
                                   {"pidfile_remove", l_pidfile_remove},
                                   {"pidfile_path", l_pidfile_path},
                                   {"runtime_dir", l_runtime_dir},
                                   {"file_tail", l_file_tail},
                                   {NULL, NULL}};
  mz_l_newclass(L, MZ_PROC_MT, meta, methods);
  luaL_setfuncs(L, funcs, 0);
  return 0;
}
