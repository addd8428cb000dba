/*
 * host.h - setting up a lua_State for mirza: standard libraries, the C
 * core and the Lua library in package.preload (embedded copies, or files
 * from a development directory for hacking and hot reload).
 */
#ifndef MIRZA_HOST_H
#define MIRZA_HOST_H

#include <lua.h>

/* Register mirza.core and the Lua modules in package.preload. dev_dir
 * (or $MIRZA_LUA_DIR when dev_dir is NULL): load mirza.* modules from
 * DIR/mirza/<name>.lua instead of the embedded copies. Raises on error. */
void mz_host_preload(lua_State *L, const char *dev_dir);

/* Message handler for lua_pcall, as lua.c's: the error (or its
 * __tostring, or a note on its type) with a traceback. */
int mz_host_msghandler(lua_State *L);

#endif
