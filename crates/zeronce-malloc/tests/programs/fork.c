/* fork from a parent whose threads allocate and free large blocks all the time: every
 * child must be able to allocate (large and small, and from a new thread) and exit.
 * Without libzeronce.so's pthread_atfork handlers 2 to 5 children of 24 hung (SIGALRM)
 * in each of three runs: they inherited locks held by threads that were gone. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
static volatile int stop;

static void *churn(void *arg) {
    uint64_t s = (uintptr_t)arg;
    while (!stop) {
        s = s * 6364136223846793005ULL + 1;
        size_t n = (2 + (s >> 40) % 14) * MIB;
        unsigned char *p = malloc(n);
        for (size_t i = 0; i < n; i += 4096) p[i] = 1;
        p = realloc(p, n + 3 * MIB);
        free(p);
        free(malloc(100));
    }
    return NULL;
}

static int child_work(void) {
    for (int j = 0; j < 6; j++) {
        size_t n = 8 * MIB + (size_t)j * 4096;
        unsigned char *p = calloc(1, n);
        if (!p) return 3;
        for (size_t i = 0; i < n; i += 4096)
            if (p[i]) return 4;
        memset(p, 5, n);
        p = realloc(p, 32 * MIB);
        if (!p || p[n - 1] != 5) return 5;
        free(p);
        free(malloc(64));
    }
    return 0;
}

static void *child_thread(void *arg) {
    (void)arg;
    return (void *)(intptr_t)child_work();
}

int main(void) {
    pthread_t t[3];
    for (uintptr_t i = 0; i < 3; i++) pthread_create(&t[i], NULL, churn, (void *)(i + 1));
    int failed = 0, forks = 24;
    for (int k = 0; k < forks; k++) {
        usleep(2000);
        fflush(stdout); /* a child must not print the parent's buffered lines again */
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20); /* a deadlock ends the child with SIGALRM */
            int r = child_work();
            pthread_t ct;
            void *tr;
            if (!r && pthread_create(&ct, NULL, child_thread, NULL) == 0) {
                pthread_join(ct, &tr);
                r = (int)(intptr_t)tr;
            }
            exit(r);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("child %d: %s %d\n", k, WIFEXITED(st) ? "exit" : "signal",
                   WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failed++;
        }
    }
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    printf("forks: %d, failed: %d\n", forks, failed);
    return failed != 0;
}
