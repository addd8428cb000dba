/*
 * jsonstream.h - incremental JSON parser (RFC 8259) for an answer that
 * streams in: pure C, no Lua, no I/O, no cJSON.
 *
 * Bytes are fed in arbitrary pieces (split at any byte, even inside an
 * escape, a surrogate pair or a literal). Text before the first '{' or
 * '[' is skipped (a preamble such as "Here is the JSON:"); the value that
 * starts there is the top-level value, and the bytes after it ends are
 * ignored. mz_js_start narrows that: only the root's bracket starts the
 * value ('{' for an object: "See [1] for the list: {...}" starts at the
 * '{'), and a start whose text turns out not to be JSON before any value
 * inside it completed (prose: "{braces}", "[see below]") is given up for
 * the next one, at or after the byte that broke it, up to `candidates`
 * starts in all. Every value completed at the chosen depth is handed out with
 * its JSON pointer and its bytes: depth 0 is the top-level value itself
 * (pointer ""), depth 1 each member or element of it ("/name", "/3"),
 * and so on; '~' and '/' in member names are written "~0" and "~1", and
 * escapes in member names are decoded (UTF-8).
 *
 * Grammar checked, strictly (RFC 8259): whitespace is space, tab, LF and
 * CR only; numbers have no leading zero and a digit after '.' and 'e'; a
 * string holds no raw byte below 0x20, only the escapes \" \\ \/ \b \f \n
 * \r \t \uXXXX, and a \u surrogate only as a high-low pair. Bytes >= 0x80
 * are not checked as UTF-8 (the value is handed on as is). cJSON is laxer
 * in exactly these places (it takes "01", "1.", "-.5", control bytes as white
 * space or in strings, "\uZZZZ" as U+0000): whatever this parser takes,
 * cJSON takes too, so a value it hands out always decodes.
 *
 * Errors are sticky (every later call returns the same status) and carry
 * the byte offset, counted from the first byte ever fed, of the byte that
 * broke the grammar (for a value over max_value_bytes: the first byte past
 * the limit, whatever the pieces). A cut input is only known at
 * mz_js_finish.
 */
#ifndef MIRZA_JSONSTREAM_H
#define MIRZA_JSONSTREAM_H

#include <stddef.h>

#define MZ_JS_DEFAULT_MAX (16u << 20) /* bytes of one value handed out */
#define MZ_JS_MAX_NEST 1000           /* nesting limit, cJSON's */

enum {
  MZ_JS_MORE = 0,       /* all the bytes taken; feed more */
  MZ_JS_VALUE = 1,      /* a value completed: *out filled; feed the rest */
  MZ_JS_END = 2,        /* the top-level value is complete */
  MZ_JS_SYNTAX = -1,    /* a byte the grammar does not allow there */
  MZ_JS_NUMBER = -2,    /* a number RFC 8259 refuses: 01, 1., 1e, - */
  MZ_JS_CONTROL = -3,   /* a control byte in a string or between tokens */
  MZ_JS_ESCAPE = -4,    /* an unknown escape (\x) */
  MZ_JS_HEX = -5,       /* a non-hex digit in \uXXXX */
  MZ_JS_SURROGATE = -6, /* a lone or unpaired \u surrogate */
  MZ_JS_DEPTH = -7,     /* nesting deeper than MZ_JS_MAX_NEST */
  MZ_JS_TOOBIG = -8,    /* a value at the chosen depth (or a pointer) over the cap */
  MZ_JS_NOMEM = -9,
  MZ_JS_CUT = -10,   /* mz_js_finish: the input ended inside the value */
  MZ_JS_NOJSON = -11 /* mz_js_finish: no '{' or '[' was ever seen */
};

#define MZ_JS_CANDIDATES 8 /* starts an answer's parser tries (mirza.jsonstage, mirza.schema) */

/* A value completed at the chosen depth. The pointers are valid until the
 * next call on the parser (text may point into the caller's buffer). */
typedef struct mz_js_value {
  const char *path; /* JSON pointer, not NUL-terminated */
  size_t path_len;
  const char *text; /* the value's bytes, exactly (no surrounding space) */
  size_t len;
  size_t offset; /* of text[0], from the first byte ever fed */
} mz_js_value;

/* The struct is public so it can be embedded without its own allocation;
 * treat the fields as private except status and err_at. */
typedef struct mz_jsonstream {
  int depth;                              /* the chosen depth */
  size_t max;                             /* cap on one handed-out value and on the pointer */
  int state;                              /* lexer state (jsonstream.c) */
  int status;                             /* 0, or the sticky error */
  size_t pos;                             /* bytes taken before the current call's buffer */
  size_t err_at;                          /* offset of the byte in error */
  int nest;                               /* containers open */
  unsigned char kind[MZ_JS_MAX_NEST + 1]; /* '{' or '[' per open container */
  size_t *plen;                           /* [1..depth]: pointer length before that level's part */
  size_t *index;                          /* [1..depth]: next element index of an array there */
  char *path;                             /* the current JSON pointer (levels 1..depth) */
  size_t path_len, path_cap;
  char *cap; /* bytes of the captured value seen in earlier calls */
  size_t cap_len, cap_cap;
  int capturing;        /* a value at the chosen depth is open */
  int cap_here;         /* ... and it began in the current call's buffer */
  size_t cap_from;      /* its first byte in the current buffer (0 if earlier) */
  size_t cap_abs;       /* its offset from the first byte ever fed */
  int key;              /* the string being read is a member name */
  int key_path;         /* ... decoded into the pointer */
  unsigned hex;         /* \uXXXX digits so far */
  int hexn;             /* how many */
  unsigned high;        /* a high surrogate waiting for its low half, or 0 */
  const char *lit;      /* the rest of a literal (true, false, null) */
  unsigned long values; /* values handed out so far */
  int root;             /* the byte a value starts with: '{', '[', or 0 for either */
  int candidates;       /* starts allowed (>= 1) */
  int tried;            /* starts made */
  int inner;            /* a value inside the current start completed: no other start */
  int first_status;     /* the first given-up start's error, and where */
  size_t first_err_at;
} mz_jsonstream;

/* depth >= 0 (deeper than MZ_JS_MAX_NEST hands nothing out); max 0 means
 * MZ_JS_DEFAULT_MAX. Returns 0, or MZ_JS_NOMEM. */
int mz_js_init(mz_jsonstream *p, int depth, size_t max);
void mz_js_free(mz_jsonstream *p);

/* Before the first feed: the top-level value starts only with root ('{'
 * or '['; 0: either, the default), and up to candidates starts are tried
 * (default 1). A start is given up for the next when a syntax error (not
 * a cap, depth or memory error) comes before any value inside it
 * completed: the next start is searched from the byte in error on (it may
 * be that byte). The values handed out stand; when no start is whole, the
 * error is the first start's (MZ_JS_CUT when the last one was still open
 * at mz_js_finish). */
void mz_js_start(mz_jsonstream *p, int root, int candidates);

/* Parse buf[0..len) from where the last call stopped. Returns MZ_JS_MORE
 * (all taken), MZ_JS_VALUE (a value completed: *out is it; the first
 * *used bytes are taken, call again with the rest, even when none is
 * left), MZ_JS_END (the top-level value is over: *used bytes ended it, the
 * rest is ignored, now and by later calls) or an error (sticky; err_at). */
int mz_js_feed(mz_jsonstream *p, const char *buf, size_t len, size_t *used, mz_js_value *out);

/* End of input: MZ_JS_END when the top-level value was complete, else the
 * sticky error, MZ_JS_CUT (err_at = bytes fed), the first given-up
 * start's error, or MZ_JS_NOJSON. Values handed out before stand. */
int mz_js_finish(mz_jsonstream *p);

/* A short static description of a status. */
const char *mz_js_strerror(int status);

#endif
