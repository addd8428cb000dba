/*
 * fastframe.h - zero-allocation fast path for the one frame that matters
 * for throughput: a plain token frame (chat.completion.chunk with one
 * choice whose delta carries only content and/or reasoning text).
 *
 * mz_fast_frame is a strict JSON scanner over one SSE data payload. It
 * accepts only a narrow, fully validated shape and answers 0 for anything
 * else, leaving the caller to decode with cJSON (decode.h) as before; so
 * it never has to report errors and never has to be complete, only never
 * accept something cJSON would read differently. Pure C, no Lua, no I/O,
 * no allocation.
 */
#ifndef MIRZA_FASTFRAME_H
#define MIRZA_FASTFRAME_H

#include <stddef.h>

/* A JSON string as it appears between its quotes in the payload. p is NULL
 * when the value is absent or null; esc says the body holds backslash
 * escapes and must go through mz_json_unescape before use. */
typedef struct mz_fast_str {
  const char *p;
  size_t len;
  int esc;
} mz_fast_str;

typedef struct mz_fast {
  int index;             /* choices[0].index (0 when absent) */
  mz_fast_str content;   /* delta.content */
  mz_fast_str reasoning; /* delta.reasoning_content if non-empty, else
                            delta.reasoning if non-empty, else absent
                            (the rule of mz_frame_choice) */
} mz_fast;

/*
 * Returns 1 and fills *out when data[0..len) is exactly (JSON whitespace
 * around tokens allowed):
 *   an object whose keys are among id, object, created, model,
 *   system_fingerprint (any valid JSON value) and "choices" (required): an
 *   array of exactly one object whose keys are among index (a plain
 *   non-negative integer), finish_reason (null), logprobs (null) and
 *   delta: an object whose keys are among content, reasoning_content and
 *   reasoning, each a string or null.
 * No key may repeat or contain an escape; strings may not hold raw control
 * characters or unpaired surrogates (\u0000 is fine: a NUL in the
 * text); numbers are at most 63 bytes;
 * nesting is at most 32 deep. Returns 0 for anything else (then *out is
 * unspecified): the caller falls back to mz_frame_decode.
 */
int mz_fast_frame(const char *data, size_t len, mz_fast *out);

/*
 * Decode a JSON string body (the bytes between the quotes) into out, which
 * must hold len bytes: the output is never longer than the input. Escapes
 * \" \\ \/ \b \f \n \r \t and \uXXXX (surrogate pairs joined) become UTF-8;
 * an unpaired surrogate becomes U+FFFD; a malformed escape is copied as it
 * is. Other bytes are copied unchanged. Returns the output length.
 */
size_t mz_json_unescape(const char *s, size_t len, char *out);

#endif
