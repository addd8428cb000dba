/*
 * test_httperr.c - the message of an error body from each daemon family
 * (mz_http_error_message, src/httperr.c): llama.cpp, vLLM (its error
 * object, FastAPI's detail string and validation list), Ollama, MTPLX,
 * OpenAI, and a plain-text, an HTML and an empty body. Each message names
 * the status and carries the daemon's own message. And mz_http_summary
 * (httperr.h): that line alone, as a 2xx that is not the answer asked
 * for (a web UI's page, a proxy's login page) is named by it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "decode.h"
#include "httperr.h"

static void check(long status, const char *body, const char *want) {
  char out[1200];
  assert_ptr_equal(mz_http_error_message(status, body, strlen(body), out, sizeof out), out);
  assert_string_equal(out, want);
}

static void test_llama_cpp(void **state) {
  (void)state;
  check(400,
        "{\"error\":{\"code\":400,\"message\":\"request (298 tokens) exceeds the available context size (256 "
        "tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":298,\"n_ctx\":256}}",
        "HTTP 400 Bad Request: request (298 tokens) exceeds the available context size (256 tokens), try increasing "
        "it");
  check(503, "{\"error\":{\"code\":503,\"message\":\"Loading model\",\"type\":\"unavailable_error\"}}",
        "HTTP 503 Service Unavailable: Loading model");
}

static void test_vllm(void **state) {
  (void)state;
  /* its own error object: the message at the top level */
  check(400,
        "{\"object\":\"error\",\"message\":\"This model's maximum context length is 4096 tokens.\","
        "\"type\":\"BadRequestError\",\"param\":null,\"code\":400}",
        "HTTP 400 Bad Request: This model's maximum context length is 4096 tokens.");
  /* FastAPI: a detail string, or the validation errors' list */
  check(404, "{\"detail\":\"Not Found\"}", "HTTP 404 Not Found: Not Found");
  check(422,
        "{\"detail\":[{\"type\":\"missing\",\"loc\":[\"body\",\"messages\"],\"msg\":\"Field required\","
        "\"input\":{}}]}",
        "HTTP 422 Unprocessable Content: body.messages: Field required");
  check(422,
        "{\"detail\":[{\"loc\":[\"body\",\"messages\",0,\"role\"],\"msg\":\"Input should be 'user'\"},"
        "{\"loc\":[\"body\",\"n\"],\"msg\":\"x\"},{\"loc\":[],\"msg\":\"y\"}]}",
        "HTTP 422 Unprocessable Content: body.messages.0.role: Input should be 'user' (and 2 more)");
  check(422, "{\"detail\":[{\"msg\":\"no location\\nsecond line\"}]}", "HTTP 422 Unprocessable Content: no location");
  /* a list that is not FastAPI's: the body's text */
  check(422, "{\"detail\":[1,2]}", "HTTP 422 Unprocessable Content: {\"detail\":[1,2]}");
}

static void test_ollama(void **state) {
  (void)state;
  check(404, "{\"error\":\"model \\\"llama3.2\\\" not found, try pulling it first\"}",
        "HTTP 404 Not Found: model \"llama3.2\" not found, try pulling it first");
}

static void test_mtplx(void **state) {
  (void)state;
  check(409,
        "{\"error\": {\"message\": \"session 's1' is already generating\", \"type\": \"conflict_error\", "
        "\"code\": \"SessionBusy\", \"param\": null}}",
        "HTTP 409 Conflict: session 's1' is already generating");
}

static void test_openai(void **state) {
  (void)state;
  check(401,
        "{\"error\":{\"message\":\"Incorrect API key provided: sk-abc***.\",\"type\":\"invalid_request_error\","
        "\"param\":null,\"code\":\"invalid_api_key\"}}",
        "HTTP 401 Unauthorized: Incorrect API key provided: sk-abc***.");
  /* an empty error message: the next source, not an empty line */
  check(429, "{\"error\":{\"message\":\"\"},\"message\":\"slow down\"}", "HTTP 429 Too Many Requests: slow down");
}

static void test_not_json(void **state) {
  (void)state;
  check(500, "\nInternal error: CUDA out of memory\ntraceback follows\n",
        "HTTP 500 Internal Server Error: Internal error: CUDA out of memory");
  check(502,
        "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
        "</center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n",
        "HTTP 502 Bad Gateway: 502 Bad Gateway");
  check(503, "", "HTTP 503 Service Unavailable");
  check(504, "{", "HTTP 504 Gateway Timeout: {");
}

/* ---- mz_http_summary ---- */

static const char *summary(const char *body, char *out, size_t outlen) {
  return mz_http_summary(body, body ? strlen(body) : 0, out, outlen);
}

/* A page: its <title> (entities decoded, white space collapsed), else its
 * first line of text. */
static void test_page_title(void **state) {
  char out[128];
  (void)state;
  assert_string_equal(summary("<!DOCTYPE html>\n<html><head>\n<title>\n  Sign in &amp; go -\n Proxy </title>"
                              "</head><body><h1>Welcome</h1></body></html>",
                              out, sizeof out),
                      "Sign in & go - Proxy");
  assert_string_equal(summary("<html><head><meta charset=\"utf-8\"><script>var x = 1;</script></head>"
                              "<body><p>Please log in</p></body></html>",
                              out, sizeof out),
                      "Please log in");
}

/* Text, JSON, nothing. */
static void test_other_bodies(void **state) {
  char out[128];
  (void)state;
  assert_string_equal(summary("\r\n  Welcome to the proxy\nsecond line\n", out, sizeof out), "Welcome to the proxy");
  assert_string_equal(summary("{\"error\":{\"message\":\"log in first\"}}", out, sizeof out), "log in first");
  assert_string_equal(summary("", out, sizeof out), "");
  assert_string_equal(summary(NULL, out, sizeof out), "");
  assert_string_equal(summary("<html><body></body></html>", out, sizeof out), "");
  assert_ptr_equal(mz_http_summary("x", 1, out, 0), out); /* no room: nothing written */
}

/* Cut to the room on a UTF-8 boundary, "..." when shortened. */
static void test_cut(void **state) {
  char out[12];
  (void)state;
  assert_string_equal(summary("<title>0123456789AB</title>", out, sizeof out), "01234567...");
  assert_string_equal(summary("<title>0123456789A</title>", out, sizeof out), "0123456789A"); /* it fits */
  assert_string_equal(summary("<title>0123456\xc3\xa9\xc3\xa9\xc3\xa9</title>", out, sizeof out), "0123456...");
  char tiny[3];
  assert_string_equal(summary("abcdef", tiny, sizeof tiny), "ab"); /* no room for "..." */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_llama_cpp),  cmocka_unit_test(test_vllm),         cmocka_unit_test(test_ollama),
      cmocka_unit_test(test_mtplx),      cmocka_unit_test(test_openai),       cmocka_unit_test(test_not_json),
      cmocka_unit_test(test_page_title), cmocka_unit_test(test_other_bodies), cmocka_unit_test(test_cut),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
