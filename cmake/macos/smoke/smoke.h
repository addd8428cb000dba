/* smoke.h - the macOS cross-build's smoke check (cmake/macos/smoke). */
#ifndef SMOKE_H
#define SMOKE_H
int smoke_core(void);
#endif
