/* The thread caches of small blocks, tried where they can go wrong. Each mode prints one
 * line and exits 0 when every check held; a failed check prints what and exits 1.
 *
 *   cache pairs   mimalloc's block sizes are the caches' classes; then producer/consumer
 *                 pairs across every small size (and past the cached ones): every block
 *                 carries its owner's tag in every byte, checked by the thread that
 *                 frees it, so a block handed out twice is seen;
 *   cache exit    2000 threads, one after another, each leaving a full cache behind:
 *                 RSS must stay bounded (a cache an ended thread kept would be lost);
 *   cache fork    forks while pairs move blocks between threads: every child allocates
 *                 and frees blocks of every cached size, from two threads, and exits
 *                 (a transfer lock held across the fork would hang it: SIGALRM). */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define RING 1024
#define MAXSIZE 1100

static void fail(const char *what, long n) {
    printf("FAILED: %s (%ld)\n", what, n);
    fflush(stdout);
    exit(1);
}

static uint64_t step(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

struct pair {
    _Atomic(unsigned char *) ring[RING];
    _Atomic(size_t) sizes[RING];
    long ops;
    unsigned char tag;
    atomic_int *stop;
};

/* A block of n bytes filled with tag; some from calloc, memalign or realloc. */
static unsigned char *make(size_t n, unsigned char tag, uint64_t *x) {
    unsigned char *p;
    switch (step(x) % 8) {
    case 0: p = calloc(1, n); break;
    case 1: p = memalign(64, n); break;
    case 2: p = realloc(malloc(n / 2 + 1), n); break;
    default: p = malloc(n);
    }
    if (!p) fail("allocation", (long)n);
    if (malloc_usable_size(p) < n) fail("usable size below the request", (long)n);
    memset(p, tag, n);
    return p;
}

static void check(unsigned char *p, size_t n, unsigned char tag) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != tag) fail("a live block was overwritten (handed out twice?)", (long)n);
}

static void *producer(void *arg) {
    struct pair *q = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull ^ q->tag;
    unsigned char *own[64] = {0};
    size_t own_n[64] = {0};
    for (long i = 0; q->stop ? !atomic_load(q->stop) : i < q->ops; i++) {
        size_t n = 1 + step(&x) % MAXSIZE;
        unsigned char *p = make(n, q->tag, &x);
        long k = i % RING;
        while (atomic_load_explicit(&q->ring[k], memory_order_acquire)) {
            if (q->stop && atomic_load(q->stop)) {
                free(p);
                goto done;
            }
            sched_yield();
        }
        atomic_store_explicit(&q->sizes[k], n, memory_order_relaxed);
        atomic_store_explicit(&q->ring[k], p, memory_order_release);
        /* Blocks of its own too, freed by itself, checked first. */
        size_t j = step(&x) % 64;
        if (own[j]) check(own[j], own_n[j], (unsigned char)(q->tag + 1));
        free(own[j]);
        own_n[j] = 1 + step(&x) % MAXSIZE;
        own[j] = make(own_n[j], (unsigned char)(q->tag + 1), &x);
    }
done:
    for (int j = 0; j < 64; j++) {
        if (own[j]) check(own[j], own_n[j], (unsigned char)(q->tag + 1));
        free(own[j]);
    }
    return NULL;
}

static void *consumer(void *arg) {
    struct pair *q = arg;
    for (long i = 0; q->stop || i < q->ops; i++) {
        long k = i % RING;
        unsigned char *p;
        while (!(p = atomic_load_explicit(&q->ring[k], memory_order_acquire))) {
            if (q->stop && atomic_load(q->stop)) return NULL;
            sched_yield();
        }
        size_t n = atomic_load_explicit(&q->sizes[k], memory_order_relaxed);
        atomic_store_explicit(&q->ring[k], NULL, memory_order_release);
        check(p, n, q->tag);
        /* Overwrite before the free: a block handed out again while this one still
         * used it would show the other tag. */
        memset(p, 0xEE, n);
        free(p);
    }
    return NULL;
}

static void run_pairs(struct pair *qs, int pairs, pthread_t *t) {
    for (int i = 0; i < pairs; i++) {
        pthread_create(&t[2 * i], NULL, producer, &qs[i]);
        pthread_create(&t[2 * i + 1], NULL, consumer, &qs[i]);
    }
}

/* The sizes the caches keep (src/classes.rs): mimalloc must hand out blocks of exactly
 * these, or blocks of that size would never be kept. */
static const size_t class_sizes[] = {16,  32,  48,  64,  80,  96,  112, 128, 160, 192,
                                     224, 256, 320, 384, 448, 512, 640, 768, 896, 1024};
enum { CLASSES = sizeof class_sizes / sizeof *class_sizes };

static int pairs_mode(void) {
    enum { PAIRS = 3 };
    for (int c = 0; c < CLASSES; c++) {
        void *p = malloc(class_sizes[c] - 7);
        if (malloc_usable_size(p) != class_sizes[c])
            fail("a block's usable size is not its class's", (long)malloc_usable_size(p));
        free(p);
    }
    static struct pair qs[PAIRS];
    pthread_t t[2 * PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        qs[i].ops = 200000;
        qs[i].tag = (unsigned char)(0x10 * (i + 1));
    }
    run_pairs(qs, PAIRS, t);
    for (int i = 0; i < 2 * PAIRS; i++) pthread_join(t[i], NULL);
    /* Leftovers in the rings (the consumer stops at ops): checked and freed here. */
    for (int i = 0; i < PAIRS; i++)
        for (int k = 0; k < RING; k++)
            if (qs[i].ring[k]) {
                check(qs[i].ring[k], qs[i].sizes[k], qs[i].tag);
                free(qs[i].ring[k]);
            }
    printf("pairs: %d x %ld blocks checked\n", PAIRS, qs[0].ops);
    return 0;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (!f || fscanf(f, "%ld %ld", &pages, &res) != 2) fail("read statm", 0);
    fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Fills every cached size's list (60 blocks of each class size) and leaves. */
static void *leave_full(void *arg) {
    (void)arg;
    enum { EACH = 60 };
    void *p[CLASSES * EACH];
    for (int i = 0; i < CLASSES * EACH; i++) {
        size_t n = class_sizes[i % CLASSES];
        p[i] = malloc(n);
        if (!p[i]) fail("malloc", (long)n);
        memset(p[i], 1, n);
    }
    for (int i = 0; i < CLASSES * EACH; i++) free(p[i]);
    return NULL;
}

static int exit_mode(void) {
    long before = rss_kib();
    for (int i = 0; i < 2000; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, leave_full, NULL)) fail("pthread_create", i);
        pthread_join(t, NULL);
    }
    long grown = rss_kib() - before;
    /* Each thread leaves about 380 KiB in its cache: 740 MiB for 2000 threads if ended
     * threads kept theirs. */
    if (grown > 64 * 1024) fail("RSS grew past 64 MiB (KiB)", grown);
    printf("exit: 2000 threads, RSS grew under 64 MiB\n");
    return 0;
}

static void *child_thread(void *arg) {
    (void)arg;
    uint64_t x = 7;
    for (int i = 0; i < 20000; i++) {
        size_t n = 1 + step(&x) % MAXSIZE;
        unsigned char *p = make(n, 3, &x);
        check(p, n, 3);
        free(p);
    }
    return NULL;
}

static int fork_mode(void) {
    enum { PAIRS = 2 };
    static struct pair qs[PAIRS];
    static atomic_int stop;
    pthread_t t[2 * PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        qs[i].tag = (unsigned char)(0x40 * (i + 1));
        qs[i].stop = &stop;
    }
    run_pairs(qs, PAIRS, t);
    int children = 24;
    for (int c = 0; c < children; c++) {
        usleep(20000);
        pid_t pid = fork();
        if (pid < 0) fail("fork", c);
        if (pid == 0) {
            alarm(20);
            pthread_t ct;
            if (pthread_create(&ct, NULL, child_thread, NULL)) _exit(3);
            child_thread(NULL);
            pthread_join(ct, NULL);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) fail("a child did not finish", c);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2 * PAIRS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < PAIRS; i++)
        for (int k = 0; k < RING; k++) free(qs[i].ring[k]);
    printf("fork: %d children finished\n", children);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "pairs")) return pairs_mode();
    if (!strcmp(mode, "exit")) return exit_mode();
    if (!strcmp(mode, "fork")) return fork_mode();
    fprintf(stderr, "usage: cache pairs|exit|fork\n");
    return 2;
}
