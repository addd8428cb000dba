/*
 * fuzz_http_error.c - the HTTP error-body reader (mz_http_error_message in
 * src/decode.h): whatever a server or proxy puts in an error body (JSON,
 * HTML, plain text, binary), the message is a NUL-terminated string that
 * fits the buffer and starts with "HTTP <status>", for any buffer size
 * down to 1 byte, and the body is never read past its length (it is not
 * NUL-terminated here, as it is not in libcurl's buffer).
 *
 * Input: two bytes choose the status and the buffer size, the rest is the
 * body.
 */
#include <string.h>

#include "decode.h"
#include "fuzz.h"

static void one(long status, const char *body, size_t len, size_t outlen) {
  char *out = malloc(outlen);
  char head[32];
  FUZZ_CHECK(out != NULL, "out of memory");
  memset(out, 'X', outlen);
  FUZZ_CHECK(mz_http_error_message(status, body, len, out, outlen) == out, "did not return out");
  size_t n = strnlen(out, outlen);
  FUZZ_CHECK(n < outlen, "message not NUL-terminated in %zu bytes", outlen);
  snprintf(head, sizeof head, "HTTP %ld", status);
  FUZZ_CHECK(strncmp(out, head, n < strlen(head) ? n : strlen(head)) == 0, "message does not start with '%s'", head);
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const long statuses[] = {400, 401, 403, 404, 413, 429, 500, 502, 503, 504, 307, 0, -1, 999};
  if (size < 2) return 0;
  long status = statuses[data[0] % (sizeof statuses / sizeof *statuses)];
  size_t outlen = data[1] < 128 ? 512 : (size_t)(data[1] - 127); /* 1..128, or the usual 512 */
  size_t len = size - 2;
  char *body = malloc(len ? len : 1); /* unterminated: reading past len is caught */
  FUZZ_CHECK(body != NULL, "out of memory");
  memcpy(body, data + 2, len);
  one(status, body, len, outlen);
  free(body);
  return 0;
}
