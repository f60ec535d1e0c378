/* glibc's allocator extensions and C23's sized frees under the preload: each must be the
 * library's (not glibc's, which would describe or trim its own idle heap), and do what it
 * says. Prints one line per check; "fail" in a line is a failure. Mode "bad-size" and
 * "bad-align" make sized frees the allocator must refuse. */
#define _GNU_SOURCE
/* `mallinfo` is deprecated in glibc, and still called by programs: it is checked here. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
#define KEEP(p) (sink = (p))

/* Resident bytes of the process (statm's second field). */
static long rss(void) {
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2) return -1;
    fclose(f);
    return resident * sysconf(_SC_PAGESIZE);
}

/* Which object the name resolves to for this program. */
static const char *owner(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    Dl_info info;
    if (!f || !dladdr(f, &info) || !info.dli_fname) return "missing";
    return strstr(info.dli_fname, "libzeronce") ? "zeronce" : info.dli_fname;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "checks";
    void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void (*free_aligned_sized)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    if (!strcmp(mode, "bad-size")) {
        char *p = KEEP(malloc(8 << 20));
        p[0] = 1;
        free_sized(p, 64 << 20);
        puts("not detected");
        return 0;
    }
    if (!strcmp(mode, "bad-small-size")) {
        char *p = KEEP(malloc(24));
        free_sized(p, 4096);
        puts("not detected");
        return 0;
    }
    if (!strcmp(mode, "bad-align")) {
        char *p = KEEP(malloc(40));
        free_aligned_sized(p + 8, 16, 32);
        puts("not detected");
        return 0;
    }
    const char *names[] = {"malloc_trim", "mallinfo2", "mallinfo", "malloc_stats",
                           "malloc_info", "mallopt", "free_sized", "free_aligned_sized"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        printf("%s: %s\n", names[i], owner(names[i]));

    /* Small blocks first (no large block freed yet): 100 MB of them freed, then a trim
     * gives their pages back and says so (it returned 0 while RSS fell: mimalloc's
     * committed count did not move). */
    enum { SMALL = 100000 };
    static char *small[SMALL];
    for (int i = 0; i < SMALL; i++) memset(small[i] = KEEP(malloc(1000)), 1, 1000);
    for (int i = 0; i < SMALL; i++) free(small[i]);
    long before = rss();
    int trimmed = malloc_trim(0);
    long after = rss();
    printf("malloc_trim of small blocks returned %d, rss dropped by 50 MiB or more: %s\n",
           trimmed, before - after >= (50L << 20) ? "ok" : "fail");

    /* mallinfo2 sees a live 256 MiB block as zeronce's (glibc's `mmap`ed-chunk field). */
    size_t big = 256 << 20;
    char *p = KEEP(calloc(1, big));
    memset(p, 1, big);
    struct mallinfo2 m = mallinfo2();
    printf("mallinfo2 hblkhd covers the live block: %s\n", m.hblkhd >= big ? "ok" : "fail");
    struct mallinfo m1 = mallinfo();
    printf("mallinfo hblkhd covers the live block: %s\n",
           (size_t)m1.hblkhd >= big ? "ok" : "fail");

    /* malloc_trim gives the freed block back now, not after the reporting delay. */
    free(p);
    before = rss();
    trimmed = malloc_trim(0);
    after = rss();
    printf("malloc_trim returned %d, rss dropped by 200 MiB or more: %s\n", trimmed,
           before - after >= (200L << 20) ? "ok" : "fail");
    printf("mallinfo2 after the free: hblkhd %s\n", mallinfo2().hblkhd < big ? "ok" : "fail");

    /* The block reads zero when handed out again (it was given back, not lost). */
    char *q = KEEP(calloc(1, big));
    size_t nonzero = 0;
    for (size_t i = 0; i < big; i += 4096) nonzero += q[i] != 0;
    printf("calloc after the trim reads zero: %s\n", nonzero == 0 ? "ok" : "fail");
    free(q);

    printf("mallopt(M_ARENA_MAX, 2): %d\n", mallopt(M_ARENA_MAX, 2));

    char buf[4096];
    FILE *f = fmemopen(buf, sizeof buf, "w");
    int r = malloc_info(0, f);
    fclose(f);
    printf("malloc_info(0): %d, xml: %s\n", r, strncmp(buf, "<malloc", 7) ? "fail" : "ok");
    f = fmemopen(buf, sizeof buf, "w");
    printf("malloc_info(1): %s\n", malloc_info(1, f) == EINVAL ? "EINVAL" : "fail");
    fclose(f);

    /* Sized frees of the right size, small and large, and NULL. */
    free_sized(KEEP(malloc(100)), 100);
    free_sized(KEEP(malloc(3 << 20)), 3 << 20);
    free_sized(NULL, 10);
    free_aligned_sized(KEEP(aligned_alloc(64, 4096)), 64, 4096);
    free_aligned_sized(KEEP(aligned_alloc(1 << 21, 5 << 20)), 1 << 21, 5 << 20);
    puts("sized frees: ok");

    malloc_stats();
    return 0;
}
