/*
 * module.c - luaopen_mirza, so that stock lua5.4 can `require "mirza"`
 * with build/lua/ on package.cpath: the same preloads as the `mirza` host.
 */
#include <lauxlib.h>

#include "host.h"

int luaopen_mirza(lua_State *L); /* exported for require "mirza" */

/* require "mirza" from stock lua5.4 (build/lua/mirza.so on package.cpath):
 * preload everything, then run the embedded (or dev) "mirza" module. */
int luaopen_mirza(lua_State *L) {
  mz_host_preload(L, NULL);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  if (lua_getfield(L, -1, "mirza") == LUA_TNIL) { /* dev mode: find it on package.path */
    lua_pop(L, 2);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "searchers");
    lua_rawgeti(L, -1, 2); /* the Lua file searcher */
    lua_pushliteral(L, "mirza");
    lua_call(L, 1, 2); /* [package, searchers, loader, path] */
    if (!lua_isfunction(L, -2)) return luaL_error(L, "mirza: %s", lua_tostring(L, -2));
    lua_pushliteral(L, "mirza");
    lua_insert(L, -2); /* [package, searchers, loader, "mirza", path] */
  } else {
    lua_pushliteral(L, "mirza");
    lua_pushliteral(L, "(embedded)");
  }
  lua_call(L, 2, 1);
  return 1;
}
