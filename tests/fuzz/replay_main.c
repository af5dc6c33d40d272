/* replay_main.c -- run a fuzz target over files, without libFuzzer.
 *
 *   replay_<target> FILE|DIR...
 *
 * Feeds each file (each regular file of a directory, sorted) to
 * LLVMFuzzerTestOneInput once. A failing invariant aborts, so the exit
 * status says whether the corpus still passes. Used by
 * tests/integration/hostile/test_fuzz_regress.py in `make test`.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    if (!f) {
        perror(path);
        return 1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0
        || fseek(f, 0, SEEK_SET) != 0) {
        perror(path);
        fclose(f);
        return 1;
    }
    /* Exact size (at least 1 byte allocated) so ASan sees overreads. */
    buf = malloc(n ? (size_t)n : 1);
    if (!buf || (n && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        perror(path);
        fclose(f);
        free(buf);
        return 1;
    }
    fclose(f);
    fprintf(stderr, "replay %s (%ld bytes)\n", path, n);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int i, rc = 0, count = 0;

    for (i = 1; i < argc; i++) {
        struct stat st;

        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 2;
        }
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            char **names = NULL;
            size_t n = 0, j;

            while (d && (e = readdir(d)) != NULL) {
                if (e->d_name[0] == '.') {
                    continue;
                }
                names = realloc(names, (n + 1) * sizeof(*names));
                names[n] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
                sprintf(names[n], "%s/%s", argv[i], e->d_name);
                n++;
            }
            if (d) {
                closedir(d);
            }
            qsort(names, n, sizeof(*names), cmp);
            for (j = 0; j < n; j++) {
                rc |= run_file(names[j]);
                count++;
                free(names[j]);
            }
            free(names);
        }
        else {
            rc |= run_file(argv[i]);
            count++;
        }
    }
    fprintf(stderr, "replayed %d input(s)\n", count);
    return rc;
}
