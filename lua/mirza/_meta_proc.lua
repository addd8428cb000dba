---@meta
--- LuaCATS descriptions of the process functions of `mirza.core`
--- (src/l_proc.c over src/supervisor.c). Not loaded at run time.
--- `mirza.daemon` (lua/mirza/daemon.lua) is built on them.

---@class mirza.SpawnOptions
---@field argv string[]       program and arguments; argv[1] is looked up in PATH; never a shell
---@field env? table<string,string>|string[]  extra environment: {NAME = "v"} or {"NAME=v"}
---@field cwd? string         working directory of the child
---@field log? string         stdout+stderr appended here (created 0644); default /dev/null
---@field keep_alive? boolean the child may outlive mirza (own session, no parent-death guard: mirza.platform.parent_death), and close() leaves it running
---@field grace? number       seconds between SIGTERM and SIGKILL when close() stops it, and when a watchdog stops it after mirza died (default 5)
---@field pidfile? integer    a port: the child's pid goes to that port's pid file, removed when close() stops it

---A child process in a process group of its own. `close()` and `<close>`
---stop the group (unless keep_alive) and free the handle; other methods on
---a closed process raise. A running process is anchored in the registry:
---dropping the handle does not stop it; the end of the Lua state does.
---@class mirza.Process
local Process = {}

---@return integer pid also the process group id
function Process:pid() end

---Non-blocking reap.
---@return boolean running
---@return string? status_text "exited with status 1", "killed by signal 9 (Killed)", ...
---@return integer? exit_code when it exited normally
---@return integer? signal when a signal killed it
function Process:poll() end

---SIGTERM to the group, up to `grace` seconds, then SIGKILL; reaps it.
---Idempotent. The handle stays open (poll, log_tail still work).
---@param grace? number seconds (default: the spawn's grace)
---@return boolean killed SIGKILL was needed
---@return string status_text
---@return integer? exit_code
---@return integer? signal
function Process:stop(grace) end

---@param n? integer lines (default 20)
---@return string tail the last n lines of the log ("" without a log)
function Process:log_tail(n) end

---@return string|nil path the log file
function Process:log_path() end

---Stop (unless keep_alive) and free. Idempotent; also `__close`/`__gc`.
---A keep_alive child is left running and no longer reaped by this handle.
function Process:close() end

---@return boolean closed
function Process:closed() end

---@class mirza.core
local core = {}

---Start a child process. Bad options raise.
---@param opts mirza.SpawnOptions
---@return mirza.Process|nil proc
---@return string? message "cannot run 'x': No such file or directory", ...
---@return string? code "spawn"
function core.spawn(opts) end

---Stop a process we did not start (an adopted daemon): SIGTERM to its
---group (or to it alone if it leads none), grace, SIGKILL. A zombie counts
---as gone.
---@param pid integer
---@param grace? number seconds (default 5)
---@return true|nil ok
---@return string? message
---@return string? code "io"
function core.pid_stop(pid, grace) end

---@param pid integer
---@return boolean alive a process with this pid exists
function core.pid_alive(pid) end

---Whether a process holds the TCP socket listening on a port (IPv4 or
---IPv6): Linux reads /proc/net/tcp{,6} and /proc/<pid>/fd, macOS asks
---libproc (`mirza.platform.facts`). The daemon supervisor trusts a pid
---reported by `/health`, or named by its pid file, only when this is true.
---@param pid integer
---@param port integer 1..65535
---@return boolean|nil listens
---@return string? message when it cannot be told: another user's process, or a build that has no way (facts "none")
---@return string? code "io"
function core.pid_listens(pid, port) end

---The pid recorded for a port (`$XDG_RUNTIME_DIR/mirza/daemon-<port>.pid`,
---else `/tmp/mirza-<uid>/`), or nil when none, unreadable, or the directory
---is not safely ours.
---@param port integer
---@return integer|nil pid
function core.pidfile_read(port) end

---Record a pid for a port (atomic rename; directory created 0700).
---@param port integer
---@param pid integer
---@return true|nil ok
---@return string? message
---@return string? code "io"
function core.pidfile_write(port, pid) end

---Remove a port's pid file (absent is fine).
---@param port integer
---@return true|nil ok
---@return string? message
---@return string? code "io"
function core.pidfile_remove(port) end

---@param port integer
---@return string|nil path of the port's pid file
---@return string? message
---@return string? code "io"
function core.pidfile_path(port) end

---The directory of the pid files, created (0700) if missing; daemon logs
---default to it too.
---@return string|nil dir
---@return string? message
---@return string? code "io"
function core.runtime_dir() end

---@param path string
---@param n? integer lines (default 20)
---@return string tail the last n lines of the file ("" when missing)
function core.file_tail(path, n) end
