/*
 * l_stream.h - mirza.open and the Stream userdata (l_stream.c).
 */
#ifndef MIRZA_L_STREAM_H
#define MIRZA_L_STREAM_H

#include <lua.h>

/* Registers the Stream metatable; pushes mirza.defaults, then open. */
int luaopen_mirza_stream(lua_State *L);

#endif
