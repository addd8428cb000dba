/*
 * fuzz_frame.c - the frame decoders: the cJSON path (src/decode.h:
 * mz_frame_decode, mz_frame_choice, mz_error_message) and the zero-copy
 * fast path (src/fastframe.h), differentially.
 *
 * The input is one SSE data payload. cJSON decodes it and every choice is
 * read (plus out-of-range indexes, which must fail cleanly). Whenever the
 * fast path claims the payload, cJSON must accept it too and read the
 * same index, content and reasoning, and nothing else a caller would act
 * on (no usage, error, role, finish_reason, tool_calls, unknown keys):
 * the fast path may only ever short-cut, never change what a script sees.
 * The string helpers run on the raw bytes as well: mz_json_unescape never
 * grows its input, mz_utf8_complete holds back at most 3 bytes.
 */
#include <string.h>

#include "decode.h"
#include "fastframe.h"
#include "fuzz.h"

/* The fast-path string, unescaped, equals what cJSON read. */
static void same_text(const mz_fast_str *fs, const char *s, size_t len, const char *what) {
  char *buf;
  size_t n;
  FUZZ_CHECK((fs->p == NULL) == (s == NULL), "%s present on one side only", what);
  if (!s) return;
  buf = malloc(fs->len + 1);
  FUZZ_CHECK(buf != NULL, "out of memory");
  n = fs->esc ? mz_json_unescape(fs->p, fs->len, buf) : (memcpy(buf, fs->p, fs->len), fs->len);
  FUZZ_CHECK(n == len && memcmp(buf, s, n) == 0, "%s differs: fast %zu bytes, cJSON %zu bytes", what, n, len);
  free(buf);
}

/* Everything a caller can read off a decoded frame. */
static void read_all(const mz_frame *f) {
  mz_choice c;
  char code[32];
  const char *type;
  for (int i = -1; i <= f->nchoices; i++) {
    int rc = mz_frame_choice(f, i, &c);
    FUZZ_CHECK(rc == 0 || rc == -1, "choice rc %d", rc);
    FUZZ_CHECK(rc == -1 || (i >= 0 && i < f->nchoices), "choice %d of %d accepted", i, f->nchoices);
    if (rc) continue;
    FUZZ_CHECK(!c.content || strlen(c.content) <= c.content_len, "content length");
    FUZZ_CHECK(!c.reasoning || c.reasoning_len > 0, "empty reasoning reported present");
    FUZZ_CHECK(c.content || c.content_len == 0, "content length without content");
  }
  const char *msg = mz_error_message(f->error, &type, code, sizeof code);
  FUZZ_CHECK(strlen(code) < sizeof code, "code not terminated");
  (void)msg;
}

static void differential(const char *data, size_t len, const mz_frame *f) {
  mz_fast ff;
  mz_choice c;
  if (!mz_fast_frame(data, len, &ff)) return;
  FUZZ_CHECK(f->root && !f->done, "fast path took what cJSON refuses");
  FUZZ_CHECK(f->nchoices == 1 && !f->unknown && !f->usage && !f->timings && !f->stats && !f->progress && !f->error,
             "fast path took a frame with more in it");
  FUZZ_CHECK(mz_frame_choice(f, 0, &c) == 0, "cJSON cannot read choice 0");
  FUZZ_CHECK(!c.role && !c.tool_calls && !c.finish_reason && !c.message && !c.logprobs,
             "fast path took a non-token choice");
  FUZZ_CHECK(ff.index == c.index, "index %d vs %d", ff.index, c.index);
  same_text(&ff.content, c.content, c.content_len, "content");
  same_text(&ff.reasoning, c.reasoning, c.reasoning_len, "reasoning");
}

static void string_helpers(const char *data, size_t len) {
  char *out = malloc(len + 1);
  FUZZ_CHECK(out != NULL, "out of memory");
  FUZZ_CHECK(mz_json_unescape(data, len, out) <= len, "unescape grew its input");
  free(out);
  size_t keep = mz_utf8_complete(data, len);
  FUZZ_CHECK(keep <= len && len - keep <= 3, "utf8_complete held back %zu of %zu", len - keep, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *bytes, size_t size) {
  /* a private copy with no terminator, so reading past len is caught */
  char *data = malloc(size ? size : 1);
  mz_frame f;
  char err[96];
  FUZZ_CHECK(data != NULL, "out of memory");
  memcpy(data, bytes, size);
  int rc = mz_frame_decode(&f, data, size, err, sizeof err);
  FUZZ_CHECK(rc == 0 || (rc == -1 && err[0] && !f.done), "decode rc %d with err '%s'", rc, err);
  FUZZ_CHECK(strlen(err) < sizeof err, "err not terminated");
  if (rc == 0) read_all(&f);
  differential(data, size, &f);
  mz_frame_free(&f);
  string_helpers(data, size);
  free(data);
  return 0;
}
