/* Blocks zeronce declines because they are larger than its largest block (1 GiB), and
 * blocks aligned to more than 2 MiB (zeronce's, in a block of the alignment): calloc reads
 * zero, realloc keeps the contents, malloc_usable_size covers the size, a fork child frees
 * what it inherited and allocates its own. Prints what it checked; the same under glibc. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;
#define KEEP(p) (sink = (p))

/* One byte in each 64th page and the last byte: enough to tell a block from its neighbours
 * without touching 1 GiB. */
static void mark(char *p, size_t n, char v) {
    for (size_t i = 0; i < n; i += 64 * 4096) p[i] = v;
    p[n - 1] = v;
}

static int marked(const char *p, size_t n, char v) {
    for (size_t i = 0; i < n; i += 64 * 4096)
        if (p[i] != v) return 0;
    return p[n - 1] == v;
}

int main(void) {
    size_t big = (size_t)1100 << 20;
    char *p = KEEP(malloc(big));
    char *z = KEEP(calloc(1, big));
    if (!p || !z) {
        puts("out of memory");
        return 1;
    }
    mark(p, big, 7);
    printf("malloc 1100 MiB: usable covers it %d\n", malloc_usable_size(p) >= big);
    printf("calloc 1100 MiB: reads zero %d\n", marked(z, big, 0));
    p = KEEP(realloc(p, big + (64 << 20)));
    printf("realloc up: kept %d\n", marked(p, big, 7));
    pid_t pid = fork();
    if (pid == 0) {
        int ok = marked(p, big, 7);
        free(p);
        char *q = KEEP(malloc(big));
        mark(q, big, 3);
        ok &= marked(q, big, 3);
        free(q);
        free(z);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("fork child: exit %d\n", WEXITSTATUS(status));
    p = KEEP(realloc(p, 4096));
    printf("realloc down to a page: kept %d\n", p[0] == 7);
    free(p);
    free(z);
    for (size_t align = (size_t)4 << 20; align <= ((size_t)1 << 30); align <<= 4) {
        char *a = KEEP(aligned_alloc(align, align + 4096));
        void *b = NULL;
        int r = posix_memalign(&b, align, 100);
        printf("aligned to %zu MiB: %d %d\n", align >> 20,
               a && (uintptr_t)a % align == 0, r == 0 && (uintptr_t)b % align == 0);
        mark(a, align + 4096, 5);
        free(a);
        free(b);
    }
    return 0;
}
