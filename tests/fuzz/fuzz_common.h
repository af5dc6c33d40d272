/* fuzz_common.h -- helpers shared by the libFuzzer targets.
 *
 * Each target defines LLVMFuzzerTestOneInput(). Built by `make fuzz` with
 * clang -fsanitize=fuzzer,address,undefined; the same sources are linked
 * with replay_main.c (no libFuzzer) to replay tests/fuzz/corpus/<target>/
 * as a regression test in `make test`. An invariant that fails calls
 * FUZZ_CHECK, which prints the reason and aborts, so libFuzzer keeps the
 * input as a crash.
 */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond, ...)                                              \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "FUZZ INVARIANT %s:%d: %s: ", __FILE__,        \
                    __LINE__, #cond);                                      \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            abort();                                                       \
        }                                                                  \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks for bugs already reported and not fixed yet are guarded by
 * FUZZ_KNOWN("id"): true (skip the check) when the id is listed in the
 * FUZZ_SKIP_KNOWN environment variable, which run.sh fills from
 * tests/fuzz/KNOWN_OPEN so that fuzzing goes on past a known bug. The
 * regression replay leaves it unset, so every check runs there and the
 * kept inputs fail until the bug is fixed. */
static inline int FUZZ_KNOWN(const char *id)
{
    const char *v = getenv("FUZZ_SKIP_KNOWN");
    size_t n = strlen(id);

    while (v && *v) {
        if (strncmp(v, id, n) == 0 && (v[n] == '\0' || v[n] == ',')) {
            return 1;
        }
        v = strchr(v, ',');
        v = v ? v + 1 : NULL;
    }
    return 0;
}

/* A NUL-terminated heap copy of data (the input may hold NULs; the C
 * string then ends at the first one, as a config value would). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);

    if (!s) {
        abort();
    }
    if (size) {
        memcpy(s, data, size);
    }
    s[size] = '\0';
    return s;
}

/* The input, read front to back; past its end every byte reads as 0. */
typedef struct {
    const uint8_t *p;
    size_t n;
} rd_t;

static inline uint8_t byte(rd_t *r)
{
    if (!r->n) {
        return 0;
    }
    r->n--;
    return *r->p++;
}

#endif
