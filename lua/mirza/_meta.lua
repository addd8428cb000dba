---@meta
--- LuaCATS descriptions of everything mirza implements in C (`mirza.core`,
--- re-exported by `require "mirza"`). Not loaded at run time. The rest of
--- the public API: _meta_lua.lua (`mirza.collect`, `request`, `watch`,
--- `reload`, `daemon`, `spawn`; the engine's, batch's and tools' options;
--- and where each module's own descriptions are), _meta_proc.lua (processes).

---@class mirza.RequestOptions
---@field url string                 full URL, e.g. "http://127.0.0.1:8766/v1/chat/completions"
---@field body? string|table         request body; a table is encoded to JSON
---@field method? string             default: POST with a body, GET without
---@field headers? table<string,string>|string[]  extra headers: {["X-MTPLX-Session-Id"]="s1"} or {"Name: value"}
---@field api_key? string            sent as `Authorization: Bearer <key>` (never logged; a line break in it raises, without showing it)
---@field timeout? number|false      connect timeout in seconds, TCP connect only (default 10, `mirza.defaults.timeout`); false: libcurl's own limit (300 s)
---@field stall_timeout? number|false  seconds without any received byte (head or body, even part of a header line; heartbeats count) before the stream fails with code "timeout"; runs from the first line of the response head on, so a request queued by the daemon (no head yet) never stalls; default 120 (`mirza.defaults.stall_timeout`); false or 0: none
---@field deadline? number|false     whole-request limit in seconds; default none
---@field max_event_bytes? integer   cap on one SSE event, a positive integer (default 4 MiB: leave it out); over it: error code "protocol"
---@field plain? boolean             not a stream: one {type="response"} event with the body
---@field header_timeout? number|false  seconds from the start until the whole response head arrived (a queued request or a long prefill waits that long), else code "timeout"; default 600 (`mirza.defaults.header_timeout`); false or 0: none
---@field on_bad_frame? "error"|"skip"  a frame that is not JSON: "error" (default) ends the stream with code "protocol", text before it kept; "skip" drops it and counts it in done.skipped_frames
---@field record_file? string        write the response as received into this file (created or truncated): the head (status line, headers) then the body as libcurl delivers it (de-chunked, decoded); closed when the transfer ends. Use `record = DIR` (mirza.record) for whole recordings
---@field hold? number|false        seconds: an event that comes less than this after the previous one is handed over at most this long after the first one still waiting came, all at once (with `merge`, one event per channel run), instead of as each read queues one: fewer wake-ups for a reader that wants the whole answer, not each token (mirza.batch holds 1 s, an engine's say 5 ms). An event that comes later than that after the previous one (a slow stream) is handed over at once. A held stream is also read less often as its answer runs: at most an eighth of its answer's age late, at most the hold, at most 250 ms (docs/performance.md, "When a stream is read"); the end, an error, a timeout come as read; `first_at()` keeps when the first token was read. `math.huge`: nothing before the end, the first event included (what `mirza.collect` does in a task without `on_json`). Default false: as they come
---@field merge? boolean            join what arrived together: a think or text delta comes with the deltas of the same channel already queued right behind it, as one event with `deltas` = how many (never waits for more; what a sink that only needs text wants: one event per read instead of per token). Default false: one event per delta
---@field step? boolean             measure the server's decode step: the stream is read as its bytes come until the first delta read after the first one's read, and that delta is handed over at once whatever the `hold`; `step()` is then the time between the two reads (a token of each sequence the server runs: its step at its load). mirza.batch asks it of the requests of its limiter's start rounds (mirza.limit). Default false
---@field record? string|false       (Lua `mirza.open`) record the request and its response into directory DIR (mirza.record); false: not even with MIRZA_RECORD
--- A wrong value raises a message naming the option, what it must be and
--- what was given ("mirza.open: 'max_event_bytes' must be a positive
--- integer (bytes) (got -1)").
--- Nothing waits forever by default: without a clock option the request
--- takes `mirza.defaults` (connect 10 s, response head 600 s, stall 120 s,
--- no deadline); each timeout's message names the clock that fired and the
--- option to change.
--- Redirects (3xx) are not followed: the stream ends with code "http" and a
--- message naming the target (also in `ev.headers.location`). Compressed
--- bodies (gzip, deflate...) are decoded, whatever Accept-Encoding was sent.

---@class mirza.Event
---@field type "think"|"text"|"tool_call"|"tool_call_done"|"progress"|"heartbeat"|"done"|"error"|"response"
---@field text? string        think/text: the delta (whole, valid UTF-8 characters: ill-formed input becomes U+FFFD as browsers' TextDecoder does; may hold NUL)
---@field index? integer      think/text/tool_call: the choice (n > 1) the delta belongs to, when not 0 (choices come interleaved: tell them apart by it)
---@field deltas? integer     think/text of a `merge` stream (and `e:say`'s turns): how many deltas this event joins, when more than one
---@field calls? table        tool_call: the delta's tool_calls array (fragments; mirza.tools accumulates them)
---@field call? table         tool_call_done (mirza.tools stage, engine turns): one whole call {index, id, name, arguments, args, error}
---@field tool_calls? table[] done (mirza.tools stage, engine turns): the whole calls, when there were any
---@field finish_reason? string  done: "stop", "length", "tool_calls", ...
---@field id? string         done: the completion id the server sent ("chatcmpl-..."), when it sent one
---@field model? string      done: the model that answered, as the server named it (the first frame's)
---@field system_fingerprint? string  done: the server's system_fingerprint, when it sent one
---@field created? integer    done: the server's created (Unix time), when it sent one
---@field choices? {index: integer, finish_reason?: string, logprobs?: table}[]  done, with n > 1 or logprobs: every choice in index order, its finish reason and its logprobs ({content = {{token, logprob, bytes, top_logprobs}, ...}}, every frame's list joined)
---@field usage? table        done: prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens
---@field stats? table        done: MTPLX mtplx_stats (ttft_s, decode_tok_s, accepted_by_depth, ...)
---@field timings? table      done: llama.cpp timings (prompt_ms, predicted_per_second, cache_n, ...)
---@field extra? table        done: top-level frame fields mirza does not know (last value of each)
---@field no_done_marker? boolean  done: the stream ended cleanly after a finish_reason but without `data: [DONE]` (a cut before any finish_reason is an error, code "closed")
---@field invalid_utf8? integer    done: ill-formed UTF-8 sequences replaced by U+FFFD (absent when none)
---@field skipped_frames? integer  done: malformed frames skipped with on_bad_frame = "skip" (absent when none)
---@field message? string     error: what went wrong
---@field code? string        error: "refused", "timeout", "http", "closed", "protocol", "server", "io"
---@field status? integer     error/response: HTTP status
---@field error? table        error: the server's error object (mid-stream error frames; for HTTP errors the body's `error` object, e.g. llama-server's {code, message, type, n_prompt_tokens, n_ctx}, `{message=s}` for a string, or the whole JSON body)
---@field headers? table<string,string>  done/error/response: the response headers, names in lowercase (repeated ones joined with ", ")
---@field retry_after? integer  error: seconds to wait, from a Retry-After header (delta-seconds or HTTP-date)
---@field body? string        response: the body; http error: the raw body (the message is "HTTP <status> <reason>: <server message, page title or first line>")
--- progress/heartbeat events carry the fields of `mtplx_progress`
--- (completion_tokens, decode_tok_s, decode_elapsed_s, phase, elapsed_s, ...).

---@class mirza.Stream
local Stream = {}
--- Inside a `mirza.loop` task, `next`, the `events()` iterator and
--- `next_batch` never block: when nothing is queued they hand the wait to
--- the scheduler (the task is suspended until the stream has news or the
--- timeout, other tasks run meanwhile), and a task that took 64 events in a
--- row (`mirza.loop.SLICE`) lets the others run first. Outside any task
--- (a plain coroutine included) they block as described. These are the
--- methods themselves: no module replaces them (`mirza.core.task`).

---Next event, waiting up to `timeout` seconds (nil: until one comes; 0: poll).
---While waiting, every other open transfer makes progress too. Ctrl-C
---during any wait of mirza raises: "interrupted" under `mirza`, the
---interpreter's own "interrupted!" under stock lua5.4 (its SIGINT hook runs
---as soon as the signal cuts the wait short).
---@param timeout? number
---@return mirza.Event|nil event nil once the final done/error event was returned
---@return string? message "timeout" when nothing came in time
---@return string? code "timeout"
function Stream:next(timeout) end

---Iterator over the remaining events, for a generic `for`; the stream is the
---loop's closing value, so `break` or an error in the body cancels the transfer.
---@return fun(s: mirza.Stream): mirza.Event|nil
---@return mirza.Stream
---@return nil
---@return mirza.Stream
function Stream:events() end

---The lighter iterator, for scripts that mostly want text: `for kind, x in
---s:chunks() do`. For a think or text delta, `kind` is `"think"` or
---`"text"` and `x` its text (a string: no table is made for it); for any
---other event, `kind` is its type and `x` the event table (`x.usage`,
---`x.message`, ...), the final `done` or `error` included. The same events,
---in the same order, as `events()`, with the same closing value; about a
---quarter less CPU per token flat out (docs/performance.md). A delta's
---`index` (choice) and `deltas` (with `merge`) are not given: use
---`events()` for those.
---@return fun(s: mirza.Stream): string|nil, string|mirza.Event|nil
---@return mirza.Stream
---@return nil
---@return mirza.Stream
function Stream:chunks() end

---Cancel the transfer if still running (the daemon stops generating) and free
---everything. Idempotent; also run by `<close>` and the garbage collector.
function Stream:close() end

---@return integer n events received and not yet read (0 while `hold` keeps them)
function Stream:pending() end

---When the first think or text delta was read (`mirza.now()` seconds), also
---after the stream closed: a time to first token that `hold` does not delay.
---@return number|nil at nil before any delta
function Stream:first_at() end

---With `step`: the time from the first delta's read to the next read that
---brought one (seconds), the server's decode step. Raises on a closed stream.
---@return number|nil dt nil before it, or without `step`
function Stream:step() end

---@return boolean finished the final event has been received
function Stream:finished() end

---@return boolean closed
function Stream:closed() end

---The events that arrived together, in one call: waits like `next` for the
---first event (up to `timeout`), then takes every event already queued
---behind it (at most `max`, default all) without driving the transfers
---again. The final done/error event, when it came, is the last element.
---The same events, in the same order, as successive `next` calls.
---@param timeout? number
---@param max? integer
---@return mirza.Event[]|nil events nil once the final event was returned
---@return string? message "timeout" when nothing came in time
---@return string? code "timeout"
function Stream:next_batch(timeout, max) end

---@class mirza
local mirza = {}

---@type string
mirza.version = "0.1.0"

---The clocks every request gets when it does not set them (seconds):
---`timeout` 10 (connect), `header_timeout` 600 (until the whole response
---head), `stall_timeout` 120 (silence once the response began). Change a
---field for every later request of this Lua state (false: none); a
---request's own option wins. Also `require("mirza.core").defaults`.
---@type {timeout: number|false, header_timeout: number|false, stall_timeout: number|false}
mirza.defaults = {}

---Start a request. Network and HTTP failures are not raised: they are the
---stream's final `{type="error"}` event, after everything received before.
---Bad arguments (unknown option, missing url) raise.
---@param opts mirza.RequestOptions
---@return mirza.Stream
function mirza.open(opts) end

---Drive every open transfer until some stream has an event ready.
---@param timeout? number seconds; nil waits until something is ready
---@return integer ready number of streams with events to read (0: timeout or nothing running)
function mirza.wait(timeout) end

---The streams that got events since the last call (each listed once, oldest
---first), waiting up to `timeout` seconds for news. Edge-triggered, unlike
---`wait`: events already reported do not make it return again, so a
---scheduler wakes exactly the streams that changed and never spins. Closed
---streams are never listed. Never yields. The scheduler in `mirza.loop` is
---built on it: while a scheduler runs, do not call it yourself (the edges
---you take are the scheduler's wake-ups).
---@param timeout? number seconds; nil waits until something is ready or nothing runs
---@param list? mirza.Stream[] reused for the result (entries past n cleared)
---@return mirza.Stream[] list the ready streams in [1..n]
---@return integer n
function mirza.ready(timeout, list) end

---Sleep while every open transfer keeps making progress. Inside a
---`mirza.loop` task the scheduler sleeps instead: the other tasks run
---meanwhile (the same function: no module replaces it).
---@param seconds number
function mirza.sleep(seconds) end

---For a scheduler (`mirza.loop` calls it around every resume of a task):
---`hook` is the scheduler's entry while a task runs (false: none). Inside
---a task that can yield, the core's pulls and `mirza.sleep` call
---`hook("wait", stream, seconds|nil) -> why` ("timer" when the time ran
---out), `hook("turn")` after `slice` events in a row and
---`hook("sleep", seconds)`, each of which yields the task; `hook("open",
---stream)` when the task opens a stream and `hook("closed", stream)` when
---a stream a task waits on is closed, which do not. Outside a task nothing
---calls it. Only in `require("mirza.core")` (not re-exported by `mirza`).
---@param hook fun(op: string, x?: any, timeout?: number): string?|false
---@param slice? number events a task may take in a row (default 64)
---@return function|false previous the hook that was in effect, or false
function mirza.task(hook, slice) end

---@class mirza.RepetitionGuard
---@field triggered boolean
---@field line string|nil   the repeated line, sentence or phrase
---@field count integer|nil how many times it came back
---@field rule string|nil   "cycle", "count" or "phrase"
local RepetitionGuard = {}

---Feed a chunk of streamed text. Once triggered, the guard stays triggered
---and keeps returning the same report.
---@param chunk string
---@return boolean triggered
---@return string|nil line the repeated line/sentence/phrase (original text)
---@return integer|nil count how many times it came back
---@return string|nil rule "cycle", "count" or "phrase"
function RepetitionGuard:feed(chunk) end

---Feed a whole text at once, or the last chunk: the text not yet cut into
---sentences is then judged as one (tests, post-hoc checks).
---@param text string
---@return boolean triggered
---@return string|nil line
---@return integer|nil count
---@return string|nil rule
function RepetitionGuard:check(text) end

---Free the guard now (idempotent; else the collector does). A method or a
---field of a closed guard raises.
function RepetitionGuard:close() end

---@return boolean
function RepetitionGuard:closed() end

---The repetition guard's rules in C, with every threshold given (the
---policy `mirza.repetition` fills them from its DEFAULTS: use
---`repetition.new`). Each is a number from 0 to 1e6 (`max_phrase`: to
---4096); any other value or key raises. Only in `require("mirza.core")`.
---@param thresholds table
---@return mirza.RepetitionGuard
function mirza.guard(thresholds) end

---@class mirza.IdSet
---A set of strings kept as 64-bit hashes, each with an integer (0 to
---2^32-1): 12 bytes a slot, at most half full, where a Lua table keyed by the
---strings takes ~76 bytes an entry. Two strings with one hash are taken for
---one (for n strings a chance of about n^2 / 2^65: 3e-8 for a million).
---mirza.batch keeps every item's custom_id in one. `#set` counts them;
---close (also `__close`, `__gc`) frees it; a method of a closed set raises.
local IdSet = {}

---Add `id` with value `n` (default 0): true, or false and the value it
---had (kept) when it was there.
---@param id string
---@param n? integer
---@return boolean added
---@return integer? before
function IdSet:add(id, n) end

---Add `id` with value `n`, or give it `n` when it is there.
---@param id string
---@param n integer
function IdSet:put(id, n) end

---The value of `id`, or nil when it is not there.
---@param id string
---@return integer|nil
function IdSet:get(id) end

---Bytes the set holds.
---@return integer
function IdSet:bytes() end

function IdSet:close() end

---A new, empty id set. Only in `require("mirza.core")`.
---@return mirza.IdSet
function mirza.idset() end

---@return number seconds monotonic clock
function mirza.now() end

---@return integer n open streams of this Lua state
function mirza.streams() end

---Whether a file descriptor is a terminal (`mirza.isatty(2)`: stderr),
---without spawning a shell; false for a bad descriptor.
---@param fd integer
---@return boolean
function mirza.isatty(fd) end

---The open-files limit of this process. Each open stream holds a socket,
---so it bounds how many streams can be open at once (with the files the
---script has open). mirza raises the soft limit to the hard one when it
---loads (1,024 streams and a few files exceed the usual soft limit of
---1,024); a stream that cannot get a socket ends with an `io` error that
---says so and names both limits. `math.huge` stands for unlimited.
---@return number soft the limit now (after the raise)
---@return number hard the most it can be raised to without privileges
---@return number before the soft limit the process started with
function mirza.fd_limit() end

---What this build of mirza does where operating systems differ (src/os.h):
---which facts about other processes it can know, how a daemon it starts
---dies with it, and how it waits for sockets.
---@class mirza.Platform
---@field os string the system's name, as `uname -s` prints it: "Linux", "Darwin"
---@field facts "linux"|"darwin"|"none" how it tells which pid listens on a port and whether a pid is a zombie: /proc, libproc and sysctl, or not at all (the portable build, os_none.c: an adopted daemon whose pid cannot be checked is left running)
---@field parent_death "pdeathsig"|"watchdog" how a daemon started without keep_alive dies when mirza does, even by SIGKILL: Linux's PR_SET_PDEATHSIG (SIGTERM), or a watchdog process in the daemon's group (SIGTERM, its grace, SIGKILL)
---@field wait "epoll"|"poll" the wait backend of the client's driver

---@type mirza.Platform
mirza.platform = {}

---File modification time, size, kind and identity (hot reload watches files
---with it; batch jobs tell a pipe from a file, and INPUT from OUTPUT).
---Available as `require("mirza.core").stat`.
---@param path string
---@return number|nil mtime seconds since the epoch (nanosecond precision)
---@return integer|string size_or_message size in bytes, or the error message
---@return string? kind "file", "directory", "fifo", "char", "socket" or "other" (of the file a link points to)
---@return string? id "device:inode": two paths naming one file have the same
---@return string? code "io"
function mirza.stat(path) end

---`mkdir -p` without a shell: `path` and every missing directory above it
---are created, each with `mode` less the umask (a parent also gets u+wx,
---as mkdir(1) gives it); a directory already there is fine. Any byte but
---NUL may be in the path (spaces, quotes, a leading `-`). Lua has no octal
---literals: `tonumber("700", 8)` is 0700. Available as
---`require("mirza.core").mkdir_p`.
---@param path string
---@param mode? integer default 0777 (`tonumber("777", 8)`): the umask decides, as for mkdir(1)
---@return true|nil ok
---@return string? message "cannot create PATH: Not a directory" (PATH or a component on the way is not a directory), "...: Permission denied", ...
---@return string? code "io"
function mirza.mkdir_p(path, mode) end

---The URL as it may be shown (in messages, logs, recordings): userinfo
---(`http://user:pass@host`) becomes `http://[redacted]@host`, and the value
---of every query parameter whose name looks like a credential (contains
---auth, cookie, key, token, secret, password or passwd, in any case) becomes
---`[redacted]`. The same rule as every message of the C core. Also
---`require("mirza.core").redact_url`.
---@param url string
---@return string url
function mirza.redact_url(url) end

---Whether a header or query parameter name looks like a credential
---(contains one of `redact_url`'s words, in any case): the one list, which
---mirza.record asks for request headers. Only in `require("mirza.core")`.
---@param name string
---@return boolean
function mirza.is_secret(name) end

---Route the library's warnings (e.g. the one below) to `fn(message)`
---instead of stderr (`mirza: warning: ...`); nil restores stderr. An
---engine given a `log` function passes those its own requests raise to
---it (level "warning") while no handler is set here. Also
---`require("mirza.core").on_warning`.
---@param fn? fun(message: string)
---@return fun(message: string)|nil previous
function mirza.on_warning(fn) end

---Whether a credential sent to `url` goes in clear to another machine: a
---plain `http://` URL (or one without a scheme) whose host is not loopback
---(127.0.0.0/8, ::1, localhost, *.localhost). Decided from the text, no
---DNS. `mirza.open` warns once per Lua state when an `api_key` or an
---Authorization-like header (any name `redact_url`'s rule calls a
---credential) is sent to such a URL.
---@param url string
---@return boolean
function mirza.plain_remote(url) end

---JSON keeps its shape through Lua: every array decoded by mirza (by
---`decode`, `stream`, a schema's answer, and the tables of the events:
---`usage`, `timings`, `extra`, `calls`, `error`) is marked as `array` marks
---one, so `encode(decode('{"a":[],"b":{}}'))` is `{"a":[],"b":{}}` again,
---byte for byte, and it stays an array when the script empties it.
---A decoded object is a plain table. A script's own empty array is
---`mirza.json.array {}` (a plain `{}` encodes as an object).
---@class mirza.json
---@field null lightuserdata  JSON null (decode produces it; encode accepts it)
mirza.json = {}

---@param value any tables with keys 1..n are arrays, and tables marked by `array` (decoded arrays are), others objects ({} is an object) with their members in key order (the same table gives the same bytes in every process); numbers are written exactly (integers in full, floats round-trip); a NUL inside a string becomes \u0000, a NUL inside a key raises
---@return string json
function mirza.json.encode(value) end

---@param text string one JSON value, whitespace around it allowed (anything after it is an error)
---@return any|nil value arrays marked as `array` marks one (so `[]` encodes as `[]` again), objects plain tables
---@return string? message parse error with its byte offset
---@return string? code "json"
function mirza.json.decode(text) end

---What a JSON text is, without decoding it into tables: the kind of its top
---value and, for an object, its member `key` when that is a string or a
---number (mirza.batch reads each line's `custom_id` so). A number of 2^53
---or more (either sign) comes as a float, which may not be the number
---written (`1234567890123456789` reads as ...768), and its text as written
---comes third (not when only cJSON's laxer grammar takes it: `01`). Same
---parser and errors as `decode`.
---@param text string
---@param key string
---@return "object"|"array"|"string"|"number"|"boolean"|"null"|nil kind nil when the text is not JSON
---@return string|number|nil value_or_message the member, or the parse error
---@return string? text_or_code a number's text past 2^53; "json" with a parse error
function mirza.json.peek(text, key) end

---Mark a table to encode as a JSON array (even when empty): a script's
---own empty array is `mirza.json.array {}`. Its elements are `t[1..#t]`,
---other keys are not written. The mark is a metatable (`__name`
---"mirza.json.array"), the one every decoded array carries.
---@param t? table default: a new empty table
---@return table t
function mirza.json.array(t) end

---Mark a table to encode as a JSON object (even when its keys are 1..n).
---@param t? table default: a new empty table
---@return table t
function mirza.json.object(t) end

---@class mirza.JSONStreamOptions
---@field depth? integer 0 (default): the whole top-level value, path ""; 1: each member or element of it ("/name", "/3"); and so on (0 to 1000)
---@field max_bytes? integer cap on one value at that depth (default 16 MiB); past it the stream is invalid
---@field root? "object"|"array" the top-level value starts only with that bracket (default: either)
---@field candidates? integer starts tried: one whose text is not JSON before any value inside it completed gives way to the next bracket, from the byte in error (default 1)

---A JSON value completed while the text streamed in.
---@class mirza.JSONEvent
---@field type "json"
---@field path string JSON pointer of the value ("" at depth 0; "~" and "/" in names as "~0" and "~1")
---@field value any decoded as `mirza.json.decode` does (null is `mirza.json.null`)

---An incremental JSON parser (C, RFC 8259, strict): fed the text in any
---pieces, it hands out each value completed at the chosen depth. Text
---before the first `{` or `[` is skipped (a preamble), text after the
---top-level value ends is ignored. `close`, `<close>` and collection free
---it; a method on a closed parser raises.
---@class mirza.JSONStream
local JSONStream = {}

---Parse the next piece of the text.
---@param text string
---@param list? mirza.JSONEvent[] append the values to this list (returned) instead of a new one per piece
---@return mirza.JSONEvent[]|nil events the values this piece completed, in order (maybe none)
---@return string? message invalid JSON with its byte offset (1-based, over all the pieces): this call and every later one
---@return string? code "protocol"
---@return mirza.JSONEvent[]? completed the values this piece completed before the error
function JSONStream:feed(text, list) end

---The end of the text: true when a whole top-level value was seen; else
---nil, "JSON cut at byte N...", "protocol" (or the invalid-JSON message, or
---"no JSON in the text"). The events already given stand.
---@return true|nil ok
---@return string? message
---@return string? code "protocol"
function JSONStream:finish() end

---Free the parser (idempotent).
function JSONStream:close() end

---@return boolean
function JSONStream:closed() end

---@param opts? mirza.JSONStreamOptions
---@return mirza.JSONStream
function mirza.json.stream(opts) end

---@class mirza.EmbedOptions
---@field url? string             a base URL ("http://h:p", "http://h:p/v1") or the route itself; or `pool`
---@field pool? mirza.Pool|string[]  endpoints to spread the chunks over (a mirza.pool, or base URLs)
---@field input string|string[]|integer[]|integer[][]  one text, texts, one token list, or token lists
---@field model? string           sent as is; none by default (the server's own; Ollama needs one)
---@field batch? integer          inputs per request (default 64)
---@field parallel? integer       requests at once to a lone `url` (default 4; a pool: its capacity)
---@field attempts? integer       tries per chunk, as mirza.retry classifies a failure (default 3)
---@field give_up_after? number   seconds every endpoint may be failing before no chunk is tried again (default 10)
---@field dimensions? integer     sent as is (shortened vectors)
---@field encoding_format? "float"|"base64"  base64: little-endian float32, 1/4 to 2/5 of the bytes
---@field body_extra? table       more body fields
---@field api_key? string
---@field headers? table<string,string>
---@field timeout? number|false
---@field header_timeout? number|false
---@field stall_timeout? number|false
---@field deadline? number|false
---@field record? string|false

---The vectors of texts from a daemon's `POST /v1/embeddings` (lua/mirza/embed.lua,
---docs/embeddings.md): `vecs[i][j]`, `vecs.n`, `vecs.dims`, `vecs.usage`,
---`vecs.model`, `vecs:packed(i)` (little-endian float32 bytes). Chunks of
---`batch` inputs run in parallel as mirza.loop tasks, in input order; a
---chunk failing for good fails the call (nothing partial): nil, message,
---code ("unsupported" for a server without the route, "http", "refused",
---"protocol", ...), status.
---@class mirza.embed
---@overload fun(opts: mirza.EmbedOptions): mirza.Vectors|nil, string?, string?, integer?
mirza.embed = {}

---The floats of little-endian float32 bytes (`vecs:packed(i)`).
---@param s string
---@return number[]|nil floats nil when #s is not a multiple of 4
---@return string? message
function mirza.embed.unpack(s) end

---A vector as little-endian float32 bytes.
---@param v number[]
---@return string
function mirza.embed.pack(v) end
