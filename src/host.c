/*
 * host.c - preloading of the mirza library into a lua_State, shared by the
 * `mirza` executable and the loadable module `mirza.so` (module.c).
 *
 * The Lua modules under lua/mirza/ are compiled in (embedded.c, generated
 * by cmake/embed.cmake) and registered in package.preload, like mpv's
 * defaults. With a development directory they are left to the normal
 * package.path search instead, so edits apply without a rebuild.
 */
#include "host.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#include "l_core.h"

extern const struct mz_embedded {
  const char *name, *path, *src;
  size_t len;
} mz_embedded[];

/* preload loader: upvalue 1 = index into mz_embedded. */
static int load_embedded(lua_State *L) {
  const struct mz_embedded *m = &mz_embedded[lua_tointeger(L, lua_upvalueindex(1))];
  lua_pushfstring(L, "@%s", m->path);
  if (luaL_loadbufferx(L, m->src, m->len, lua_tostring(L, -1), "t") != LUA_OK) return lua_error(L);
  lua_pushstring(L, m->name);
  lua_pushstring(L, m->path);
  lua_call(L, 2, 1);
  return 1;
}

static void prepend_path(lua_State *L, const char *dir) {
  lua_getglobal(L, "package"); /* [package] */
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

void mz_host_preload(lua_State *L, const char *dev_dir) {
  if (!dev_dir) dev_dir = getenv("MIRZA_LUA_DIR");
  if (dev_dir && !*dev_dir) dev_dir = NULL;
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE); /* [preload] */
  lua_pushcfunction(L, luaopen_mirza_core);
  lua_setfield(L, -2, "mirza.core");
  for (int i = 0; !dev_dir && mz_embedded[i].name; i++) {
    lua_pushinteger(L, i);
    lua_pushcclosure(L, load_embedded, 1);
    lua_setfield(L, -2, mz_embedded[i].name);
  }
  lua_pop(L, 1);
  if (dev_dir) prepend_path(L, dev_dir);
  lua_pushstring(L, dev_dir ? dev_dir : "");
  lua_setfield(L, LUA_REGISTRYINDEX, "mirza.dev_dir");
}

int mz_host_msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}
