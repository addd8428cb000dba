---@meta
--- LuaCATS description of `mirza.readline` (src/repl.c): the interactive
--- prompt's line editing, for a script on a terminal. Only the `mirza` host
--- built with GNU readline has it (`pcall(require, "mirza.readline")`
--- fails elsewhere: under stock lua5.4, or without readline); scripts/chat.lua
--- uses it when stdin and stdout are a terminal. Not loaded at run time.

---@class mirza.readline
local readline = {}

---Read one line with line editing and history (a line that is not empty
---is added to the history). Ctrl-C (or SIGTERM) while it waits raises
---"interrupted", the line dropped and the terminal given back.
---@param prompt? string shown before the line (default "")
---@return string|nil line nil at the end of input (Ctrl-D on an empty line)
function readline.read(prompt) end

return readline
