/*
 * test_httperr.c - the message of an error body from each daemon family
 * (mz_http_error_message, src/httperr.c): llama.cpp, vLLM (its error
 * object, FastAPI's detail string and validation list), Ollama, MTPLX,
 * OpenAI, and a plain-text, an HTML and an empty body. Each message names
 * the status and carries the daemon's own message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "decode.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_llama_cpp), cmocka_unit_test(test_vllm),   cmocka_unit_test(test_ollama),
      cmocka_unit_test(test_mtplx),     cmocka_unit_test(test_openai), cmocka_unit_test(test_not_json),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
