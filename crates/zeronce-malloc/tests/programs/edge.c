/* The C rules an interposed allocator must keep. "same": output equal to glibc's;
 * "strict": rules where glibc 2.36 is laxer (aligned_alloc of a non-power of two). */
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#define MIB ((size_t)1 << 20)

static void check(const char *what, void *p, int err) {
    printf("%s: %s errno %s\n", what, p ? "ptr" : "NULL",
           err == ENOMEM ? "ENOMEM" : err == EINVAL ? "EINVAL" : err ? "other" : "0");
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "strict")) {
        errno = 0;
        void *p = aligned_alloc(3, 64);
        check("aligned_alloc(3, 64)", p, errno);
        errno = 0;
        p = aligned_alloc(24, 8 * MIB);
        check("aligned_alloc(24, 8M)", p, errno);
        return 0;
    }
    free(NULL);
    puts("free(NULL): ok");
    void *p = malloc(10 * MIB);
    errno = 0;
    void *r = realloc(p, 0);
    printf("realloc(large, 0): %s\n", r ? "ptr" : "NULL");
    p = malloc(100);
    r = realloc(p, 0);
    printf("realloc(small, 0): %s\n", r ? "ptr" : "NULL");
    void *out = (void *)1;
    printf("posix_memalign(3): %s\n", posix_memalign(&out, 3, 64) == EINVAL ? "EINVAL" : "?");
    printf("posix_memalign(4): %s\n", posix_memalign(&out, 4, 64) == EINVAL ? "EINVAL" : "?");
    printf("posix_memalign(24): %s\n", posix_memalign(&out, 24, 8 * MIB) == EINVAL ? "EINVAL" : "?");
    printf("out untouched: %d\n", out == (void *)1);
    size_t aligns[] = {16, 64, 4096, 65536, 2 * MIB, 4 * MIB};
    size_t sizes[] = {1, 1000, 3 * MIB, 9 * MIB};
    int aligned = 1;
    for (int a = 0; a < 6; a++)
        for (int s = 0; s < 4; s++) {
            void *q;
            if (posix_memalign(&q, aligns[a], sizes[s]) || (uintptr_t)q % aligns[a]) aligned = 0;
            memset(q, 1, sizes[s]);
            free(q);
            q = aligned_alloc(aligns[a], sizes[s]);
            if (!q || (uintptr_t)q % aligns[a]) aligned = 0;
            free(q);
            q = memalign(aligns[a], sizes[s]);
            if (!q || (uintptr_t)q % aligns[a]) aligned = 0;
            free(q);
        }
    printf("aligned: %d\n", aligned);
    void *v = valloc(5 * MIB), *pv = pvalloc(100);
    printf("valloc/pvalloc page aligned: %d\n", (uintptr_t)v % 4096 == 0 && (uintptr_t)pv % 4096 == 0);
    printf("pvalloc usable >= 4096: %d\n", malloc_usable_size(pv) >= 4096);
    free(v);
    free(pv);
    errno = 0;
    p = malloc(SIZE_MAX);
    check("malloc(SIZE_MAX)", p, errno);
    errno = 0;
    p = malloc((size_t)1 << 62);
    check("malloc(2^62)", p, errno);
    errno = 0;
    p = calloc(SIZE_MAX / 2, 3);
    check("calloc overflow", p, errno);
    errno = 0;
    p = malloc(10);
    r = reallocarray(p, SIZE_MAX / 2, 3);
    check("reallocarray overflow", r, errno);
    free(p);
    p = malloc(10 * MIB);
    errno = 0;
    r = realloc(p, (size_t)1 << 62);
    check("realloc(large, 2^62)", r, errno);
    free(p);
    /* Past RAM + swap: under the kernel's default overcommit heuristic glibc's mapping is
     * refused (NULL, ENOMEM) and a program may fall back; under overcommit 1 it is granted. */
    struct sysinfo si;
    sysinfo(&si);
    size_t past = ((size_t)si.totalram + si.totalswap) * si.mem_unit + ((size_t)1 << 30);
    errno = 0;
    p = malloc(past);
    check("malloc(RAM + swap + 1G)", p, errno);
    free(p);
    errno = 0;
    p = calloc(past / 4096, 4096);
    check("calloc(RAM + swap + 1G)", p, errno);
    free(p);
    errno = 0;
    r = NULL;
    printf("posix_memalign(RAM + swap + 1G): %s\n",
           posix_memalign(&r, 4 * MIB, past) == ENOMEM ? "ENOMEM" : "0");
    free(r);
    for (int i = 0; i < 2; i++) {
        p = malloc(i ? 10 * MIB : 100);
        memset(p, 7, 100);
        errno = 0;
        r = realloc(p, past);
        check(i ? "realloc(large, RAM + swap + 1G)" : "realloc(small, RAM + swap + 1G)", r, errno);
        printf("  block kept: %d\n", r || ((unsigned char *)p)[99] == 7);
        free(r ? r : p);
    }
    size_t n = 5 * MIB + 7;
    p = malloc(n);
    printf("malloc_usable_size(5M+7) >= size: %d\n", malloc_usable_size(p) >= n);
    memset(p, 3, malloc_usable_size(p));
    free(p);
    printf("malloc_usable_size(NULL): %zu\n", malloc_usable_size(NULL));
    /* A successful allocation leaves errno alone: 8 MiB (zeronce's) and 3 GiB (over
     * zeronce's largest block: passed to mimalloc, which tries a huge-page mapping first). */
    size_t big[] = {8 * MIB, (size_t)3 << 30};
    for (int i = 0; i < 2; i++) {
        errno = 0;
        p = malloc(big[i]);
        printf("malloc(%zu MiB) then errno: %s\n", big[i] / MIB, p ? strerror(errno) : "NULL");
        free(p);
    }
    p = malloc(0);
    printf("malloc(0): %s\n", p ? "ptr" : "NULL");
    free(p);
    return 0;
}
