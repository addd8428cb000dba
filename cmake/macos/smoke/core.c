/* core.c - the Lua-free half of the smoke check: libcurl and cJSON. */
#include "smoke.h"

#include <cJSON.h>
#include <curl/curl.h>

int smoke_core(void) {
  CURL *h = curl_easy_init();
  cJSON *j = cJSON_Parse("{\"a\": 1}");
  int ok = h != NULL && j != NULL && cJSON_GetObjectItem(j, "a") != NULL;
  cJSON_Delete(j);
  curl_easy_cleanup(h);
  return ok;
}
