/*
 * cli.c - the parts of the `mirza` command line that are not the Lua run
 * itself: ready-made jobs found by name (`mirza chat`), and the long forms
 * of --help (jobs, environment) and --version (the libraries in use).
 *
 * Jobs live in the installed jobs directory, found relative to the
 * executable (MIRZA_JOBS_FROM_BIN, e.g. "../share/mirza/jobs", so a
 * relocated prefix still works), and, for a binary run from its own build
 * tree, in the source tree's scripts/. Both paths are compiled in by
 * CMakeLists.txt; nothing here reads the environment.
 */
#include "cli.h"

#include <cJSON.h>
#include <curl/curl.h>
#include <dirent.h>
#include <limits.h>
#include <lua.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mirza.h"
#include "os.h"

#ifndef MIRZA_JOBS_FROM_BIN
#define MIRZA_JOBS_FROM_BIN "../share/mirza/jobs"
#endif

enum { MAX_DIRS = 2 };

static int is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir/name into out; 0 if it does not fit. */
static int join(char *out, size_t size, const char *dir, const char *name) {
  int n = snprintf(out, size, "%s/%s", dir, name);
  return n > 0 && (size_t)n < size;
}

/* The directory of the running executable (no trailing slash), or "". */
static void exe_dir(char *out, size_t size, const char *argv0) {
  char buf[PATH_MAX];
  out[0] = '\0';
  if (mz_os_exe_path(buf, sizeof buf, argv0) < 0) return;
  char *slash = strrchr(buf, '/');
  if (slash) *slash = '\0';
  snprintf(out, size, "%s", buf);
}

#if defined(MIRZA_BUILD_DIR) && defined(MIRZA_SOURCE_DIR)
/* 1 if a and b name the same existing directory. */
static int same_dir(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
#endif

/* Fill dirs[] with the jobs directories, most specific first; returns the
 * count. Each entry has room for PATH_MAX bytes. */
static int jobs_dirs(char dirs[MAX_DIRS][PATH_MAX], const char *argv0) {
  char bin[PATH_MAX];
  int n = 0;
  exe_dir(bin, sizeof bin, argv0);
  if (!*bin) return 0;
#if defined(MIRZA_BUILD_DIR) && defined(MIRZA_SOURCE_DIR)
  if (same_dir(bin, MIRZA_BUILD_DIR)) snprintf(dirs[n++], PATH_MAX, "%s/scripts", MIRZA_SOURCE_DIR);
#endif
  const char *rel = MIRZA_JOBS_FROM_BIN; /* absolute when so configured */
  char joined[2 * PATH_MAX];
  // cppcheck-suppress knownConditionTrueFalse ; MIRZA_JOBS_FROM_BIN is absolute in some builds
  if (rel[0] == '/') snprintf(joined, sizeof joined, "%s", rel);
  else if (!join(joined, sizeof joined, bin, rel)) return n;
  if (realpath(joined, dirs[n])) n++; /* "P/share/...", not "P/bin/../share/..." */
  return n;
}

const char *mz_cli_job(const char *name, const char *argv0, char *buf, size_t size) {
  if (is_file(name) || strchr(name, '/') || !*name) return name;
  char dirs[MAX_DIRS][PATH_MAX];
  int n = jobs_dirs(dirs, argv0);
  for (int i = 0; i < n; i++) {
    int len = snprintf(buf, size, "%s/%s.lua", dirs[i], name);
    if (len > 0 && (size_t)len < size && is_file(buf)) return buf;
  }
  return name;
}

/* The job's summary: its first comment paragraph, "--- name.lua - summary"
 * and the "--- " lines that continue it up to a bare "---", joined into one
 * line (out is always terminated; a summary longer than size is cut). */
static void job_summary(const char *path, char *out, size_t size) {
  char line[256];
  size_t len = 0;
  out[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  const char *text = fgets(line, sizeof line, f) ? strstr(line, " - ") : NULL;
  if (text) text += 3;
  while (text && *text && len + 1 < size) {
    int n = snprintf(out + len, size - len, "%s%.*s", len ? " " : "", (int)strcspn(text, "\r\n"), text);
    if (n < 0) break;
    len = len + (size_t)n < size ? len + (size_t)n : size - 1;
    text = fgets(line, sizeof line, f) && strncmp(line, "--- ", 4) == 0 ? line + 4 : NULL;
  }
  fclose(f);
}

/* Print "  name         summary", the summary wrapped at word boundaries to
 * 79 columns, its continuation lines indented under its first word. */
static void print_job(FILE *out, const char *name, int name_len, const char *summary) {
  enum { INDENT = 14, WIDTH = 79 };
  int col = fprintf(out, "  %-12.*s", name_len, name);
  for (const char *w = summary + strspn(summary, " "); *w;) {
    int n = (int)strcspn(w, " ");
    if (col > INDENT && col + 1 + n > WIDTH) col = fprintf(out, "\n%*s", INDENT, "") - 1;
    col += fprintf(out, " %.*s", n, w);
    w += n + strspn(w + n, " ");
  }
  fputc('\n', out);
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static int is_job(const struct dirent *e) {
  size_t n = strlen(e->d_name);
  return n > 4 && e->d_name[0] != '.' && strcmp(e->d_name + n - 4, ".lua") == 0;
}

/* List one directory's jobs; names already listed by an earlier
 * directory are skipped (it shadows them). */
static void list_dir(FILE *out, char dirs[MAX_DIRS][PATH_MAX], int which) {
  struct dirent **ents;
  int n = scandir(dirs[which], &ents, is_job, by_name);
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX + 256], summary[1024];
    int shadowed = 0;
    for (int j = 0; j < which && !shadowed; j++)
      shadowed = join(path, sizeof path, dirs[j], ents[i]->d_name) && is_file(path);
    if (!join(path, sizeof path, dirs[which], ents[i]->d_name)) path[0] = '\0';
    job_summary(path, summary, sizeof summary);
    if (!shadowed) print_job(out, ents[i]->d_name, (int)(strlen(ents[i]->d_name) - 4), summary);
    free(ents[i]);
  }
  if (n >= 0) free(ents);
}

static const char env_text[] = "Environment:\n"
                               "  MIRZA_LUA_DIR         load the mirza.* modules from there (as --lua-dir)\n"
                               "  MIRZA_SIM             the mirza-sim binary (default: next to mirza, then PATH)\n"
                               "  MIRZA_CONFIG          engine config file (default ~/.config/mirza/config.lua)\n"
                               "  MIRZA_BASE_URL, MIRZA_MODEL, MIRZA_MODEL_ID, MIRZA_API_KEY, MIRZA_HOST,\n"
                               "  MIRZA_PORT, MIRZA_PRESET, MIRZA_SESSION_ID, MIRZA_DIALECT,\n"
                               "  MIRZA_CONTEXT_WINDOW, MIRZA_MAX_TOKENS, MIRZA_TEMPERATURE, MIRZA_AUTOSTART,\n"
                               "  MIRZA_DAEMON, MIRZA_THINK_TAGS, MIRZA_VERBOSE\n"
                               "                        engine settings (over the config file and the code)\n"
                               "  MIRZA_DEMO_PORT       the demo job's simulator port (default 18766)\n"
                               "  MIRZA_RECORD          record every request and turn into this directory\n"
                               "  MIRZA_API_KEY, OPENAI_API_KEY\n"
                               "                        the batch job's server key (after --api-key)\n"
                               "  MIRZA_SDK_TEST=skip   the bench's openai SDK row and the SDK test not run\n"
                               "  MIRZA_BENCH_EXIT      (bench) where a bench child writes its peak RSS\n";

void mz_cli_help(FILE *out, const char *argv0) {
  char dirs[MAX_DIRS][PATH_MAX];
  int n = jobs_dirs(dirs, argv0);
  fputs("Jobs (mirza NAME [args]):\n", out);
  for (int i = 0; i < n; i++) list_dir(out, dirs, i);
  fputs(env_text, out);
}

void mz_cli_version(FILE *out) {
  const curl_version_info_data *cv = curl_version_info(CURLVERSION_NOW);
  fprintf(out, "mirza %s (%s, libcurl %s, cJSON %s)\n", MIRZA_VERSION, LUA_RELEASE, cv->version, cJSON_Version());
}
