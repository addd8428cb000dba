/*
 * l_os.c - the OS and text helpers of `mirza.core`: stat, mkdir_p,
 * isatty, the open-files limit, what this build has (platform), the URL
 * checks (redact_url, plain_remote, is_secret) and the warning handler.
 */
#include <errno.h>
#include <math.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "l_core.h"
#include "l_util.h"
#include "mirza.h"
#include "nofile.h"
#include "os.h"
#include "supervisor.h"
#include "watch.h"

/* What kind of file st describes, as mirza.stat names it. */
static const char *file_kind(const struct stat *st) {
  if (S_ISREG(st->st_mode)) return "file";
  if (S_ISDIR(st->st_mode)) return "directory";
  if (S_ISFIFO(st->st_mode)) return "fifo";
  if (S_ISCHR(st->st_mode)) return "char";
  if (S_ISSOCK(st->st_mode)) return "socket";
  return "other";
}

/* mirza.core.stat(path) -> mtime (seconds, ns precision), size, kind, id
 * | nil, msg, "io" (hot reload watches files with it between turns; batch
 * jobs tell a pipe from a file and two names of one file apart: id is
 * "device:inode"). */
static int l_stat(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  if (stat(path, &st) != 0) return mz_l_failf(L, MZ_E_IO, "%s: %s", path, strerror(errno));
  lua_pushnumber(L, (lua_Number)mz_os_mtime(&st));
  lua_pushinteger(L, (lua_Integer)st.st_size);
  lua_pushstring(L, file_kind(&st));
  lua_pushfstring(L, "%I:%I", (lua_Integer)st.st_dev, (lua_Integer)st.st_ino);
  return 4;
}

/* mirza.mkdir_p(path [, mode]) -> true | nil, msg, "io": mkdir -p without
 * a shell (mz_mkdir_mode), so any byte but NUL may be in path. Each missing
 * directory gets mode (default 0777), less the umask, as mkdir(1) does; an
 * existing directory is fine, anything else there fails. */
static int l_mkdir_p(lua_State *L) {
  size_t len;
  const char *path = luaL_checklstring(L, 1, &len);
  lua_Integer mode = luaL_optinteger(L, 2, 0777);
  luaL_argcheck(L, strlen(path) == len, 1, "path holds a NUL byte");
  luaL_argcheck(L, mode >= 0 && mode <= 07777, 2, "mode must be 0 to 4095 (0700 is tonumber(\"700\", 8))");
  char buf[PATH_MAX];
  if (len >= sizeof buf) return mz_l_failf(L, MZ_E_IO, "cannot create %s: %s", path, strerror(ENAMETOOLONG));
  memcpy(buf, path, len + 1);
  if (mz_mkdir_mode(buf, (mode_t)mode) < 0)
    return mz_l_failf(L, MZ_E_IO, "cannot create %s: %s", path, strerror(errno));
  lua_pushboolean(L, 1);
  return 1;
}

#define WARN_KEY "mirza.on_warning"

void mz_l_warn(lua_State *L, const char *msg) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, WARN_KEY) == LUA_TFUNCTION) {
    lua_pushstring(L, msg);
    if (lua_pcall(L, 1, 0, 0) == LUA_OK) return;
    fprintf(stderr, "mirza: the mirza.on_warning handler failed (%s); the warning was: %s\n",
            lua_isstring(L, -1) ? lua_tostring(L, -1) : "?", msg);
  } else {
    fprintf(stderr, "mirza: warning: %s\n", msg);
  }
  lua_pop(L, 1);
}

/* mirza.on_warning([fn]) -> the previous handler: fn(message) receives the
 * library's warnings instead of stderr (nil: back to stderr). */
static int l_on_warning(lua_State *L) {
  if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, WARN_KEY);
  lua_insert(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, WARN_KEY);
  return 1;
}

/* mirza.core.plain_remote(url) -> whether a credential sent to url goes in
 * clear to another machine (mz_url_plain_remote). */
static int l_plain_remote(lua_State *L) {
  lua_pushboolean(L, mz_url_plain_remote(luaL_checkstring(L, 1)));
  return 1;
}

/* mirza.core.redact_url(url) -> the URL as it may be shown (mz_redact_url). */
static int l_redact_url(lua_State *L) {
  char *r = mz_redact_url(luaL_checkstring(L, 1));
  if (!r) return luaL_error(L, "out of memory");
  lua_pushstring(L, r);
  free(r);
  return 1;
}

/* mirza.core.is_secret(name) -> whether a header or query parameter name
 * looks like a credential (mz_is_secret: the one list, used by
 * redact_url and by mirza.record for request headers). */
static int l_is_secret(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  lua_pushboolean(L, mz_is_secret(name, len));
  return 1;
}

/* mirza.isatty(fd) -> whether the descriptor is a terminal (progress lines
 * redraw in place there); asked without spawning a shell. */
static int l_isatty(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  lua_pushboolean(L, fd >= 0 && fd <= 1024 && isatty((int)fd));
  return 1;
}

/* mirza.fd_limit() -> soft, hard, before: the open-files limit (each
 * stream holds a socket), raised from `before` to the hard limit when the
 * module loaded (the state's client: mz_client_new); math.huge for
 * unlimited. */
static int l_fd_limit(lua_State *L) {
  long v[3];
  mz_nofile(&v[0], &v[1], &v[2]);
  for (int i = 0; i < 3; i++) {
    if (v[i] < 0) lua_pushnumber(L, HUGE_VAL);
    else lua_pushinteger(L, v[i]);
  }
  return 3;
}

/* mirza.platform: what this build does where systems differ (os.h,
 * watch.h), as fields of a table: os (uname's name: "Linux", "Darwin"),
 * facts ("linux", "darwin", "none"), parent_death ("pdeathsig",
 * "watchdog"), wait ("epoll", "poll"). */
static void push_platform(lua_State *L) {
  struct utsname u;
  lua_createtable(L, 0, 4);
  lua_pushstring(L, uname(&u) == 0 ? u.sysname : "unknown");
  lua_setfield(L, -2, "os");
  lua_pushstring(L, mz_os_facts);
  lua_setfield(L, -2, "facts");
  lua_pushstring(L, mz_os_guard_kind);
  lua_setfield(L, -2, "parent_death");
  lua_pushstring(L, mz_watch_backend);
  lua_setfield(L, -2, "wait");
}

void mz_l_os_funcs(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"stat", l_stat},           {"mkdir_p", l_mkdir_p},       {"redact_url", l_redact_url},
      {"is_secret", l_is_secret}, {"on_warning", l_on_warning}, {"plain_remote", l_plain_remote},
      {"isatty", l_isatty},       {"fd_limit", l_fd_limit},     {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  push_platform(L);
  lua_setfield(L, -2, "platform");
}
