/* The C workload of `zeronce bench malloc`: the same binary runs under every allocator
 * (LD_PRELOAD or none); each run prints one JSON object on its last line. Compiled at
 * run time with `cc -O2 -pthread`.
 *
 *   malloc_work reuse DELAY_MS ROUNDS   calloc 256/128/64 MiB in turn, touch, free, idle
 *                                       DELAY_MS, calloc+touch again (timed: thread CPU
 *                                       time and the thread's own minor faults; round 0's
 *                                       and the untimed part's CPU reported beside it, and
 *                                       the timed part's wall time and process CPU time,
 *                                       an allocator's own threads included)
 *   malloc_work idle MIB                free MIB in 64 MiB blocks; RSS 1 s and 5 s later
 *   malloc_work small THREADS OPS       producer/consumer pairs of small objects (wall)
 *   malloc_work churn OPS THREADED      one thread: 1000 live blocks of 1-1024 bytes, OPS
 *                                       times free a random one and malloc another (wall);
 *                                       THREADED 1: another thread allocated first (what
 *                                       an allocator that tells one thread from many does
 *                                       once a program has several)
 *   malloc_work hot MIB ROUNDS          calloc MIB, read every line, write it all, free, at
 *                                       once again (a cache-hot buffer reused: thread CPU
 *                                       of the rounds after the first, timed apart)
 *   malloc_work firstpass PREP          no allocator in it (mmap): 256 MiB faulted in by a
 *                                       one-byte store a page, then PREP (none, read:
 *                                       every line read, store2: a second one-byte store a
 *                                       page, thp: the faults in huge pages), then two
 *                                       memsets of zeros timed: what the first full write
 *                                       of freshly faulted pages costs on this machine;
 *                                       PREP stream or stream-ahead: nothing between, and
 *                                       both passes are streaming stores, page by page,
 *                                       stream-ahead's with a prefetch four pages ahead
 *                                       of the stores (zeronce's zeroing kernels)
 *   malloc_work large ITERS             20 live buffers of 5-25 MiB (random sizes, most not
 *                                       powers of two): ITERS times free one and malloc a
 *                                       new one, writing every page (wall, and process CPU
 *                                       with every thread's, an allocator's own included)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>

static double ms_of(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static long thread_minflt(void) {
    struct rusage r;
    getrusage(RUSAGE_THREAD, &r);
    return r.ru_minflt;
}

static double rss_mib(void) {
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}

static void touch(volatile char *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
}

/* Makes the compiler assume `p`'s memory is read here: a write just before `free` is
 * otherwise dead code to it, and GCC at -O2 drops the `memset` of `hot`. */
static void escape(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

static void *must(void *p) {
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static int reuse(long delay_ms, long rounds) {
    static const size_t mib[3] = {256, 128, 64};
    double cpu = 0, first = 0, setup = 0, wall = 0, process = 0;
    long faults = 0, pages = 0;
    for (long r = 0; r < rounds; r++) {
        size_t n = mib[r % 3] << 20;
        /* Not the figure, reported beside it: the calloc, touch and free before the idle
         * pause (fresh memory in round 0, where allocators that zero at calloc pay for
         * zeroing and faults at once and one that knows fresh memory is zero does not). */
        double s0 = ms_of(CLOCK_THREAD_CPUTIME_ID);
        char *p = must(calloc(1, n));
        touch(p, n);
        free(p);
        setup += ms_of(CLOCK_THREAD_CPUTIME_ID) - s0;
        usleep(delay_ms * 1000);
        double c0 = ms_of(CLOCK_THREAD_CPUTIME_ID);
        double w0 = ms_of(CLOCK_MONOTONIC), p0 = ms_of(CLOCK_PROCESS_CPUTIME_ID);
        long f0 = thread_minflt();
        p = must(calloc(1, n));
        if (p[n / 2] != 0) {
            fprintf(stderr, "calloc returned non-zero memory\n");
            return 1;
        }
        touch(p, n);
        double c = ms_of(CLOCK_THREAD_CPUTIME_ID) - c0;
        wall += ms_of(CLOCK_MONOTONIC) - w0;
        process += ms_of(CLOCK_PROCESS_CPUTIME_ID) - p0;
        cpu += c;
        if (r == 0) first = c;
        faults += thread_minflt() - f0;
        pages += n / 4096;
        free(p);
    }
    /* cpu_ms is the figure (the calling thread's CPU: what the program waits for when
     * the machine has a CPU to spare); first_reuse_cpu_ms is its round 0 (the first reuse
     * of memory the kernel faulted in), setup_cpu_ms the untimed part above. wall_ms and
     * process_cpu_ms are the same timed part's wall time and the CPU of every thread of
     * the process meanwhile (an allocator's zeroing threads included). */
    printf("{\"workload\":\"reuse\",\"delay_ms\":%ld,\"idle_ms\":%ld,\"rounds\":%ld,"
           "\"cpu_ms\":%.3f,\"first_reuse_cpu_ms\":%.3f,\"setup_cpu_ms\":%.3f,"
           "\"wall_ms\":%.3f,\"process_cpu_ms\":%.3f,"
           "\"minor_faults\":%ld,\"pages_touched\":%ld}\n",
           delay_ms, delay_ms, rounds, cpu, first, setup, wall, process, faults, pages);
    return 0;
}

static int idle(long mib) {
    long blocks = mib / 64;
    char **p = must(calloc(blocks, sizeof *p));
    for (long i = 0; i < blocks; i++) {
        p[i] = must(malloc(64 << 20));
        memset(p[i], 1, 64 << 20);
    }
    double peak = rss_mib();
    for (long i = 0; i < blocks; i++) free(p[i]);
    free(p);
    double at0 = rss_mib();
    sleep(1);
    double at1 = rss_mib();
    sleep(4);
    printf("{\"workload\":\"idle\",\"freed_mib\":%ld,\"rss_peak_mib\":%.1f,"
           "\"rss_at_free_mib\":%.1f,\"rss_1s_mib\":%.1f,\"rss_5s_mib\":%.1f}\n",
           blocks * 64, peak, at0, at1, rss_mib());
    return 0;
}

/* A single-producer single-consumer ring of pointers: the consumer frees what the
 * producer allocated (cross-thread frees); the producer also churns a slot array of its
 * own (larson-style: free a random slot, allocate it again). */
#define RING 4096
struct pair {
    _Atomic(char *) ring[RING];
    long ops;
    uint64_t seed;
    long checksum;
};

static uint64_t next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static size_t small_size(uint64_t *x) { return 16 + next(x) % 1009; }

static void *producer(void *arg) {
    struct pair *q = arg;
    char *slots[1000] = {0};
    uint64_t x = q->seed;
    for (long i = 0; i < q->ops; i++) {
        size_t n = small_size(&x);
        char *p = must(malloc(n));
        p[0] = (char)n;
        p[n - 1] = 1;
        _Atomic(char *) *cell = &q->ring[i % RING];
        while (atomic_load_explicit(cell, memory_order_acquire)) sched_yield();
        atomic_store_explicit(cell, p, memory_order_release);
        size_t k = next(&x) % 1000;
        free(slots[k]);
        slots[k] = must(malloc(small_size(&x)));
        slots[k][0] = 1;
    }
    for (int k = 0; k < 1000; k++) free(slots[k]);
    return NULL;
}

static void *consumer(void *arg) {
    struct pair *q = arg;
    long sum = 0;
    for (long i = 0; i < q->ops; i++) {
        _Atomic(char *) *cell = &q->ring[i % RING];
        char *p;
        while (!(p = atomic_load_explicit(cell, memory_order_acquire))) sched_yield();
        atomic_store_explicit(cell, NULL, memory_order_release);
        sum += (unsigned char)p[0];
        free(p);
    }
    q->checksum = sum;
    return NULL;
}

static int small(long pairs, long ops) {
    struct pair *q = must(calloc(pairs, sizeof *q));
    pthread_t *t = must(calloc(2 * pairs, sizeof *t));
    double w0 = ms_of(CLOCK_MONOTONIC);
    for (long i = 0; i < pairs; i++) {
        q[i].ops = ops;
        q[i].seed = 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 1);
        pthread_create(&t[2 * i], NULL, producer, &q[i]);
        pthread_create(&t[2 * i + 1], NULL, consumer, &q[i]);
    }
    long sum = 0;
    for (long i = 0; i < 2 * pairs; i++) pthread_join(t[i], NULL);
    for (long i = 0; i < pairs; i++) sum += q[i].checksum;
    double wall = ms_of(CLOCK_MONOTONIC) - w0;
    printf("{\"workload\":\"small\",\"pairs\":%ld,\"ops\":%ld,\"checksum\":%ld,"
           "\"wall_ms\":%.3f,\"rss_mib\":%.1f}\n",
           pairs, ops, sum, wall, rss_mib());
    free(t);
    free(q);
    return 0;
}

static void *allocate_once(void *arg) {
    free(must(malloc(64)));
    return arg;
}

/* Small-object churn on one thread: the locality an allocator gives a program's blocks. */
static int churn(long ops, long threaded) {
    enum { SLOTS = 1000 };
    char **slots = must(calloc(SLOTS, sizeof *slots));
    if (threaded) {
        pthread_t t;
        pthread_create(&t, NULL, allocate_once, NULL);
        pthread_join(t, NULL);
    }
    uint64_t x = 0x2545F4914F6CDD1Dull;
    long sum = 0;
    double w0 = ms_of(CLOCK_MONOTONIC);
    for (long i = 0; i < ops; i++) {
        size_t k = next(&x) % SLOTS;
        if (slots[k]) sum += slots[k][0];
        free(slots[k]);
        size_t n = 1 + next(&x) % 1024;
        slots[k] = must(malloc(n));
        slots[k][0] = (char)n;
    }
    double wall = ms_of(CLOCK_MONOTONIC) - w0;
    for (int k = 0; k < SLOTS; k++) free(slots[k]);
    free(slots);
    printf("{\"workload\":\"churn\",\"ops\":%ld,\"threaded\":%ld,\"checksum\":%ld,"
           "\"wall_ms\":%.3f}\n",
           ops, threaded, sum, wall);
    return 0;
}

/* A buffer of MIB MiB: calloc, read, write, free, ROUNDS times. The first round (fresh
 * memory: its page faults, and on a virtual machine the host's) is timed apart from the
 * reuse rounds after it, which are the figure. */
static int hot(long mib, long rounds) {
    size_t n = (size_t)mib << 20;
    long sum = 0;
    double c0 = ms_of(CLOCK_THREAD_CPUTIME_ID), first = 0;
    for (long r = 0; r < rounds; r++) {
        volatile char *p = must(calloc(1, n));
        for (size_t i = 0; i < n; i += 64) sum += p[i];
        memset((char *)p, (int)r, n);
        escape((char *)p);
        free((char *)p);
        if (r == 0) first = ms_of(CLOCK_THREAD_CPUTIME_ID) - c0;
    }
    double cpu = ms_of(CLOCK_THREAD_CPUTIME_ID) - c0 - first;
    if (sum != 0) {
        fprintf(stderr, "calloc returned non-zero memory\n");
        return 1;
    }
    long reused = rounds > 1 ? rounds - 1 : 1;
    printf("{\"workload\":\"hot\",\"mib\":%ld,\"rounds\":%ld,\"cpu_ms\":%.3f,"
           "\"cpu_ms_per_round\":%.4f,\"first_round_cpu_ms\":%.3f}\n",
           mib, rounds, cpu, cpu / reused, first);
    return 0;
}

/* The malloc-large pattern (image and array buffers): sizes past every allocator's small
 * classes, freed and allocated at random, each new buffer written in full. */
static int large(long iters) {
    enum { LIVE = 20 };
    char *buf[LIVE] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    double w0 = ms_of(CLOCK_MONOTONIC), c0 = ms_of(CLOCK_PROCESS_CPUTIME_ID);
    long sum = 0;
    for (long i = 0; i < iters; i++) {
        int k = (int)(next(&x) % LIVE);
        size_t n = ((size_t)5 << 20) + next(&x) % ((size_t)20 << 20);
        free(buf[k]);
        buf[k] = must(malloc(n));
        for (size_t j = 0; j < n; j += 4096) buf[k][j] = (char)(j >> 12);
        sum += buf[k][4096];
    }
    for (int k = 0; k < LIVE; k++) free(buf[k]);
    printf("{\"workload\":\"large\",\"iters\":%ld,\"checksum\":%ld,\"wall_ms\":%.3f,"
           "\"process_cpu_ms\":%.3f,\"rss_mib\":%.1f}\n",
           iters, sum, ms_of(CLOCK_MONOTONIC) - w0, ms_of(CLOCK_PROCESS_CPUTIME_ID) - c0,
           rss_mib());
    return 0;
}

/* See the usage at the top: the cost `reuse` at once pays in its round 0 (zeronce does not
 * write fresh memory at calloc, so its first full write of the pages is the timed one). */
/* Zeros [p, p + n) (n a multiple of 4096, p page-aligned) with 32-byte streaming stores
 * (16-byte ones without AVX2), page by page; with `ahead`, each page's stores start after
 * a prefetch of the page four pages on, so its page walk overlaps them (what zeronce's
 * zeroing kernels do). */
__attribute__((target("avx2"))) static void stream_zero_avx2(char *p, size_t n, int ahead) {
    __m256i z = _mm256_setzero_si256();
    for (size_t page = 0; page < n; page += 4096) {
        if (ahead && page + 4 * 4096 < n) _mm_prefetch(p + page + 4 * 4096, _MM_HINT_NTA);
        for (size_t i = page; i < page + 4096; i += 64) {
            _mm256_stream_si256((__m256i *)(p + i), z);
            _mm256_stream_si256((__m256i *)(p + i + 32), z);
        }
    }
    _mm_sfence();
}

static void stream_zero(char *p, size_t n, int ahead) {
    if (__builtin_cpu_supports("avx2")) return stream_zero_avx2(p, n, ahead);
    __m128i z = _mm_setzero_si128();
    for (size_t page = 0; page < n; page += 4096) {
        if (ahead && page + 4 * 4096 < n) _mm_prefetch(p + page + 4 * 4096, _MM_HINT_NTA);
        for (size_t i = page; i < page + 4096; i += 64)
            for (size_t k = 0; k < 64; k += 16) _mm_stream_si128((__m128i *)(p + i + k), z);
    }
    _mm_sfence();
}

static int firstpass(const char *prep) {
    size_t n = (size_t)256 << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "mmap failed\n");
        return 1;
    }
    if (!strcmp(prep, "thp")) madvise(p, n, MADV_HUGEPAGE);
    touch(p, n);
    volatile long sum = 0;
    if (!strcmp(prep, "read"))
        for (size_t i = 0; i < n; i += 64) sum += p[i];
    if (!strcmp(prep, "store2"))
        for (size_t i = 0; i < n; i += 4096) p[i + 64] = 1;
    int stream = !strncmp(prep, "stream", 6), ahead = !strcmp(prep, "stream-ahead");
    double t0 = ms_of(CLOCK_MONOTONIC);
    if (stream) stream_zero(p, n, ahead);
    else memset(p, 0, n);
    double t1 = ms_of(CLOCK_MONOTONIC);
    if (stream) stream_zero(p, n, ahead);
    else memset(p, 0, n);
    double t2 = ms_of(CLOCK_MONOTONIC);
    printf("{\"workload\":\"firstpass\",\"prep\":\"%s\",\"first_ms\":%.3f,\"second_ms\":%.3f}\n",
           prep, t1 - t0, t2 - t1);
    munmap(p, n);
    return 0;
}

int main(int argc, char **argv) {
    long a = argc > 2 ? atol(argv[2]) : 0, b = argc > 3 ? atol(argv[3]) : 0;
    if (argc > 3 && !strcmp(argv[1], "reuse")) return reuse(a, b);
    if (argc > 2 && !strcmp(argv[1], "idle")) return idle(a);
    if (argc > 3 && !strcmp(argv[1], "small")) return small(a, b);
    if (argc > 3 && !strcmp(argv[1], "churn")) return churn(a, b);
    if (argc > 3 && !strcmp(argv[1], "hot")) return hot(a, b);
    if (argc > 2 && !strcmp(argv[1], "large")) return large(a);
    if (argc > 2 && !strcmp(argv[1], "firstpass")) return firstpass(argv[2]);
    fprintf(stderr, "usage: malloc_work reuse DELAY_MS ROUNDS | idle MIB | small PAIRS OPS"
                    " | churn OPS THREADED"
                    " | hot MIB ROUNDS | large ITERS"
                    " | firstpass none|read|store2|thp|stream|stream-ahead\n");
    return 2;
}
