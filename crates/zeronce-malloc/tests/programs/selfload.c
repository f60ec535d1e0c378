/* libzeronce.so loaded with dlopen by a running, multi-threaded program (not preloaded):
 * it must load (its thread-local storage comes from glibc's static TLS surplus), serve
 * calls made through dlsym from several threads, large and small, and survive dlclose
 * (its threads and fork handlers stay: it is never unmapped) and a fork after it. The
 * program's own malloc stays glibc's: symbols already bound do not move. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *(*z_malloc)(size_t);
static void *(*z_calloc)(size_t, size_t);
static void *(*z_realloc)(void *, size_t);
static void (*z_free)(void *);
static size_t (*z_usable)(void *);

static void *glibc_churn(void *arg) {
    (void)arg;
    for (int i = 0; i < 2000; i++) free(malloc(64 + i % 512));
    return NULL;
}

static void *zeronce_work(void *arg) {
    size_t mib = (size_t)(intptr_t)arg;
    size_t n = mib << 20;
    unsigned char *p = z_calloc(1, n);
    if (!p) return (void *)1;
    for (size_t i = 0; i < n; i += 4096)
        if (p[i]) return (void *)2;
    memset(p, 0x5a, n);
    p = z_realloc(p, 2 * n);
    if (!p || p[n - 1] != 0x5a || z_usable(p) < 2 * n) return (void *)3;
    z_free(p);
    for (int i = 0; i < 1000; i++) {
        char *s = z_malloc(16 + i);
        s[0] = 1;
        z_free(s);
    }
    return NULL;
}

int main(int argc, char **argv) {
    pthread_t churn[2];
    for (int i = 0; i < 2; i++) pthread_create(&churn[i], NULL, glibc_churn, NULL);
    int flags = RTLD_NOW | (argc > 2 && strcmp(argv[2], "global") == 0 ? RTLD_GLOBAL : RTLD_LOCAL);
    void *h = dlopen(argv[1], flags);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    z_malloc = (void *(*)(size_t))dlsym(h, "malloc");
    z_calloc = (void *(*)(size_t, size_t))dlsym(h, "calloc");
    z_realloc = (void *(*)(void *, size_t))dlsym(h, "realloc");
    z_free = (void (*)(void *))dlsym(h, "free");
    z_usable = (size_t (*)(void *))dlsym(h, "malloc_usable_size");
    if (!z_malloc || !z_calloc || !z_realloc || !z_free || !z_usable) { printf("dlsym failed\n"); return 1; }
    if (z_malloc == (void *(*)(size_t))malloc) { printf("dlsym found glibc's malloc\n"); return 1; }
    pthread_t t[4];
    for (intptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, zeronce_work, (void *)(4 + 4 * i));
    long bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)(intptr_t)r;
    }
    for (int i = 0; i < 2; i++) pthread_join(churn[i], NULL);
    void *kept = z_calloc(1, 8 << 20); /* live across dlclose */
    dlclose(h);
    pid_t child = fork();
    if (child == 0) _exit(z_usable(kept) >= (8 << 20) ? 0 : 1);
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad += 100;
    z_free(kept);
    char *mine = malloc(100);
    strcpy(mine, "glibc");
    printf("loaded %s, 4 threads through dlsym: %s, own malloc: %s\n",
           argc > 2 ? argv[2] : "local", bad ? "FAILED" : "ok", mine);
    free(mine);
    return bad ? 1 : 0;
}
