/*
 * cli.h - `mirza` command-line helpers without Lua: jobs by name, the
 * long --help and --version texts.
 */
#ifndef MIRZA_CLI_H
#define MIRZA_CLI_H

#include <stddef.h>
#include <stdio.h>

/* The script to run for `mirza NAME`: NAME itself when it is a file or a
 * path, else DIR/NAME.lua from the first jobs directory that has it
 * (written into buf), else NAME (so the load error names it). argv0 is the
 * host's argv[0], for systems that cannot say where the executable is. */
const char *mz_cli_job(const char *name, const char *argv0, char *buf, size_t size);

/* The jobs found (name and summary) and the MIRZA_* environment. */
void mz_cli_help(FILE *out, const char *argv0);

/* "mirza X.Y.Z (Lua 5.4.N, libcurl A.B.C, cJSON D.E.F)": runtime versions. */
void mz_cli_version(FILE *out);

#endif
