/* Threads that start and exit (their allocator caches go back) and a dlopen'ed library
 * whose thread-local storage glibc allocates through malloc inside __tls_get_addr. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int (*touch_tls)(int);

static void *worker(void *arg) {
    int v = (int)(intptr_t)arg;
    void *small[200];
    for (int i = 0; i < 200; i++) small[i] = malloc(16 + i * 8);
    char *big = calloc(1, 3 << 20);
    big[100] = (char)v;
    long r = touch_tls ? touch_tls(v % 100) : 0;
    r += big[100] + big[(3 << 20) - 1];
    free(big);
    for (int i = 0; i < 200; i++) free(small[i]);
    return (void *)r;
}

int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    touch_tls = (int (*)(int))dlsym(h, "touch_tls");
    long total = 0;
    for (int round = 0; round < 50; round++) {
        pthread_t t[4];
        for (intptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(round * 4 + i));
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(t[i], &r);
            total += (long)r;
        }
    }
    dlclose(h);
    printf("200 threads, total %ld\n", total);
    return 0;
}
