/* Large zeroed buffers reused, realloc growth, many small allocations, threads: the
 * same output with and without LD_PRELOAD=libzeronce.so. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static uint64_t sum(const unsigned char *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 4096) s += p[i];
    return s + p[n - 1];
}

static size_t nonzero(const unsigned char *p, size_t n) {
    size_t z = 0;
    for (size_t i = 0; i < n; i += 512) z += p[i] != 0;
    return z + (p[n - 1] != 0);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static uint64_t totals[5];

static void *worker(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg, total = 0;
    for (int r = 0; r < 60; r++) {
        size_t n = (2 + lcg(&seed) % 12) * MIB + lcg(&seed) % 4096;
        unsigned char *p = (r & 1) ? calloc(n, 1) : malloc(n);
        if (!p) return (void *)1;
        if ((r & 1) && nonzero(p, n)) return (void *)2;
        memset(p, r, n);
        total += sum(p, n);
        void *small[64];
        for (int i = 0; i < 64; i++) small[i] = malloc(1 + lcg(&seed) % 2000);
        for (int i = 0; i < 64; i++) free(small[i]);
        free(p);
    }
    totals[(uintptr_t)arg] = total;
    return NULL;
}

int main(void) {
    /* 1. large zeroed buffers, sizes that are not powers of two, freed and reused */
    for (int r = 0; r < 8; r++) {
        size_t n = (16 + 8 * (size_t)(r % 4)) * MIB + 12345;
        unsigned char *p = calloc(1, n);
        if (!p) { puts("calloc failed"); return 1; }
        size_t nz = nonzero(p, n);
        memset(p, r + 1, n);
        printf("calloc round %d: %zu bytes, nonzero before writing %zu, sum %llu\n", r, n, nz,
               (unsigned long long)sum(p, n));
        free(p);
    }
    /* 2. realloc growth keeps contents; shrinking below the threshold too */
    unsigned char *q = malloc(3 * MIB);
    memset(q, 7, 3 * MIB);
    int kept = 1;
    for (size_t n = 4 * MIB; n <= 64 * MIB; n *= 2) {
        q = realloc(q, n);
        if (!q) { puts("realloc failed"); return 1; }
        for (size_t i = 0; i < 3 * MIB; i += 1000) kept &= q[i] == 7;
        memset(q + 3 * MIB, 9, n - 3 * MIB);
    }
    q = realloc(q, 1000);
    for (size_t i = 0; i < 1000; i++) kept &= q[i] == 7;
    printf("realloc kept contents: %d\n", kept);
    free(q);
    /* 3. many small allocations, checked on free */
    enum { SLOTS = 4096 };
    static unsigned char *slot[SLOTS];
    static size_t len[SLOTS];
    uint64_t seed = 42, check = 0;
    int bad = 0;
    for (int op = 0; op < 300000; op++) {
        int i = lcg(&seed) % SLOTS;
        if (slot[i]) {
            for (size_t k = 0; k < len[i]; k += 61) bad |= slot[i][k] != (unsigned char)(i + len[i]);
            free(slot[i]);
            slot[i] = NULL;
        } else {
            len[i] = 1 + lcg(&seed) % ((op % 97) ? 512 : 70000);
            slot[i] = (op & 1) ? malloc(len[i]) : calloc(1, len[i]);
            memset(slot[i], (unsigned char)(i + len[i]), len[i]);
            check += len[i];
        }
    }
    for (int i = 0; i < SLOTS; i++) free(slot[i]);
    printf("small: %llu bytes, corrupted %d\n", (unsigned long long)check, bad);
    /* 4. threads allocating and freeing large and small blocks at once */
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        if (r) printf("thread %d failed: %p\n", i + 1, r);
        printf("thread %d: total %llu\n", i + 1, (unsigned long long)totals[i + 1]);
    }
    return 0;
}
