-- .luacheckrc - luacheck (Debian package lua-check) over the Lua code:
--   luacheck lua scripts tests
-- scripts/check-install runs it: any warning fails (MIRZA_LINT_STRICT=0 only prints).
std = "lua54"
max_line_length = 120
-- `mirza` as a global: the REPL and `mirza -l mirza` define it.
read_globals = { "mirza" }

-- busted specs run with build/mirza as the interpreter
files["tests"] = { std = "+busted" }

-- LuaCATS descriptions of the C functions: empty bodies, named parameters.
-- No line-length limit there: a LuaCATS `---@field` description has no
-- continuation syntax, so it must stay on one line.
files["lua/mirza/_meta*.lua"] = { ignore = { "212", "241", "111", "131" }, max_line_length = false }
