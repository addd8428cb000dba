/*
 * replay.c - run a fuzz target over saved inputs without fuzzing, so the
 * regression corpus runs under any compiler (gcc, ASan, valgrind) as an
 * ordinary ctest test. Arguments are files or directories (every regular
 * file inside, not recursive); an input that breaks an invariant aborts
 * in the target. A missing argument is an error, so a mistyped path cannot
 * turn the test into one that passes by running nothing.
 */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char *buf;
  long n;
  if (!f) return perror(path), -1;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return fprintf(stderr, "%s: cannot size\n", path), -1;
  }
  buf = malloc((size_t)n + 1); /* +1: never malloc(0) */
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return fprintf(stderr, "%s: cannot read\n", path), -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  return 1;
}

/* Every regular file of dir; returns how many ran, -1 on error. */
static int run_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  char path[4096];
  struct stat st;
  int count = 0, r = 0;
  if (!d) return perror(dir), -1;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if ((r = run_file(path)) < 0) break;
    count += r;
  }
  closedir(d);
  return r < 0 ? -1 : count;
}

int main(int argc, char **argv) {
  struct stat st;
  int total = 0, r;
  for (int i = 1; i < argc; i++) {
    if (stat(argv[i], &st) != 0) return perror(argv[i]), 2;
    r = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]);
    if (r < 0) return 2;
    total += r;
  }
  printf("replayed %d inputs\n", total);
  return total > 0 ? 0 : 2;
}
