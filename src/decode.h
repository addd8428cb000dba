/*
 * decode.h - decoding of OpenAI-compatible streaming payloads
 * (chat.completion.chunk frames as sent by MTPLX, llama-server, vLLM,
 * Ollama) and of HTTP error bodies. Pure C over cJSON, no Lua, no I/O.
 *
 * A frame is decoded once into an mz_frame that owns the cJSON tree and
 * points into it: the caller reads the fields it needs and may detach
 * subtrees (cJSON_DetachItemViaPointer) to keep them past mz_frame_free.
 * Every field is optional: servers ship often and omit what they like.
 */
#ifndef MIRZA_DECODE_H
#define MIRZA_DECODE_H

#include <stddef.h>
#include <cJSON.h>

typedef struct mz_frame {
  cJSON *root;           /* owned parse tree; NULL for [DONE] */
  int done;              /* the payload was the literal [DONE] */
  const cJSON *choices;  /* the "choices" array, or NULL */
  int nchoices;          /* 0 for usage-only frames (choices: []) */
  const cJSON *usage;    /* top-level objects, NULL when absent or null */
  const cJSON *timings;  /* llama.cpp */
  const cJSON *stats;    /* MTPLX mtplx_stats */
  const cJSON *progress; /* MTPLX mtplx_progress */
  const cJSON *error;    /* top-level "error" (object or string) */
  const char *id;        /* top-level "id" (the completion id) if a string */
  const char *model;     /* top-level "model" (the model that answered) if a string */
  const char *fprint;    /* top-level "system_fingerprint" if a string */
  const cJSON *created;  /* top-level "created" if a number */
  int heartbeat;         /* mtplx_progress.heartbeat == true */
  int unknown;           /* count of top-level keys not listed below */
} mz_frame;

/* Top-level keys mz_frame knows: id object created model system_fingerprint
 * choices usage timings mtplx_stats mtplx_progress error. Any other key
 * counts in `unknown` so a caller can keep the raw frame reachable. */

typedef struct mz_choice {
  int index;             /* "index", default: position in the array */
  const char *role;      /* delta.role or NULL */
  const char *reasoning; /* delta.reasoning_content, else delta.reasoning */
  size_t reasoning_len;  /* 0 when absent, null or "" */
  const char *content;   /* delta.content (null/absent -> NULL, len 0) */
  size_t content_len;
  const cJSON *tool_calls;   /* delta.tool_calls array, or NULL */
  const char *finish_reason; /* NULL when null or absent */
  const cJSON *message;      /* non-streamed: choices[i].message, or NULL */
  const cJSON *logprobs;     /* choices[i].logprobs when an object (OpenAI's
                                {"content": [...], "refusal": ...}), else NULL */
} mz_choice;

/* Parse JSON text data[0..len) (not necessarily NUL-terminated) with
 * cJSON, keeping "\u0000" in string values: a string's length, NULs
 * included, is mz_json_strlen(item) (keys still end at their first NUL).
 * Like cJSON_ParseWithLengthOpts, parsing stops after the first value;
 * *end (NULL is fine) is the offset where it stopped, or where it failed
 * when the result is NULL. The caller owns the tree. */
cJSON *mz_json_parse(const char *data, size_t len, size_t *end);

/* mz_json_parse of all of data[0..len): a value with anything but
 * whitespace after it is refused rather than silently cut (NULL, *at the
 * offset of what follows it); on a parse error *at is where it failed. */
cJSON *mz_json_parse_all(const char *data, size_t len, size_t *at);

/* Length of a string item of a tree from mz_json_parse (or any cJSON
 * string), NUL characters included. */
size_t mz_json_strlen(const cJSON *v);

/* Decode one SSE data payload (not necessarily NUL-terminated). A "\u0000"
 * in a string value is kept: mz_choice lengths count it, and
 * mz_json_strlen gives the others' (the tree is mz_json_parse's). "[DONE]"
 * (surrounding whitespace allowed) sets done. Returns 0, or -1 with a short
 * message in err when the payload is not JSON or not a JSON object. The
 * frame must be freed with mz_frame_free in both cases. */
int mz_frame_decode(mz_frame *f, const char *data, size_t len, char *err, size_t errlen);
void mz_frame_free(mz_frame *f);

/* Fill *c from choices[i] (delta for streamed chunks, message for a
 * non-streamed chat.completion). Returns 0, or -1 if i is out of range or
 * the element is not an object. */
int mz_frame_choice(const mz_frame *f, int i, mz_choice *c);

/* The message of an error value: {"message": "..."} -> message, a plain
 * string -> itself, anything else -> NULL. Also reports "type" and "code"
 * (code may be a string or a number, rendered into code_buf). */
const char *mz_error_message(const cJSON *error, const char **type, char *code_buf, size_t code_len);

/* Render the message for an HTTP error response into out (always
 * NUL-terminated; httperr.c): "HTTP <status> <reason phrase>: <line>" where
 * the line is the server's error message for a JSON body (error.message,
 * error as a string, detail — FastAPI's validation list as its first
 * entry, "body.messages: Field required (and N more)" — message), the
 * <title> (else the first line of
 * text) of an HTML page, or the first line of any other body; whitespace
 * and control characters collapse to one space, and a line over ~200 bytes
 * is cut on a UTF-8 boundary and ends in "...". An empty body gives
 * "HTTP <status> <reason>"; an unknown status has no reason phrase.
 * Returns out. */
char *mz_http_error_message(long status, const char *body, size_t len, char *out, size_t outlen);

/* The standard reason phrase of an HTTP status ("" when unknown). */
const char *mz_http_reason(long status);

/* The error object of an HTTP error body, for scripts to inspect: the
 * body's "error" object (llama-server, MTPLX, OpenAI), {"message": s} for
 * "error": s, the whole body for another JSON object, or NULL (not a JSON
 * object). The caller owns the tree. */
cJSON *mz_http_error_object(const char *body, size_t len);

/* Length of the longest prefix of s[0..len) that does not end inside an
 * incomplete UTF-8 sequence: the caller holds back s[ret..len) (at most 3
 * bytes) and prepends it to the next piece of the same channel. Invalid
 * bytes are not held back (mz_utf8_repair replaces them). */
size_t mz_utf8_complete(const char *s, size_t len);

/* Length of the longest prefix of s[0..len) that is valid UTF-8 (len when
 * all of it is). Fast on ASCII; no allocation. */
size_t mz_utf8_valid(const char *s, size_t len);

/* Copy s[0..len) to out (room for 3 * len bytes), replacing each maximal
 * subpart of an ill-formed sequence by U+FFFD as the WHATWG decoder does
 * ("\xF0\x9F\x98" -> one U+FFFD, "\xFF\xFE" -> two, "\xED\xA0\x80" (a
 * surrogate) -> three). A sequence cut by the end is replaced too: hold it
 * back first (mz_utf8_complete) if more may come. Adds the number of
 * replacements to *bad (NULL is fine). Returns the output length. */
size_t mz_utf8_repair(const char *s, size_t len, char *out, size_t *bad);

#endif
