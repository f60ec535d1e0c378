/* Frees the allocator must refuse, one per mode: a large block freed twice, a pointer into
 * one (also of a block larger than zeronce's largest, 1 GiB, and of one aligned to 4 MiB),
 * a small block freed twice (of 24 bytes, of 1 byte, the first free on another
 * thread), a pointer into a small block that no block could start at, and a small block
 * reallocated after its free. Mode "fine" does what looks
 * alike and is right: a block freed, handed out again and freed; list heads whose second
 * word points at themselves. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *free_it(void *p) {
    free(p);
    return NULL;
}

struct node { struct node *next, *prev; };

/* Seen by the compiler as used elsewhere: no allocation here may be optimised away. */
static void *volatile sink;
#define KEEP(p) (sink = (p))

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "double";
    if (!strcmp(mode, "interior") || !strcmp(mode, "huge-interior") ||
        !strcmp(mode, "aligned-interior")) {
        char *p = KEEP(mode[0] == 'i'   ? malloc(8 << 20)
                       : mode[0] == 'h' ? malloc((size_t)1200 << 20)
                                        : aligned_alloc(4 << 20, 5 << 20));
        p[0] = 1;
        free(p + 4096);
    } else if (!strcmp(mode, "double") || !strcmp(mode, "huge-double") ||
               !strcmp(mode, "aligned-double")) {
        char *p = KEEP(mode[0] == 'd'   ? malloc(8 << 20)
                       : mode[0] == 'h' ? malloc((size_t)1200 << 20)
                                        : aligned_alloc(4 << 20, 5 << 20));
        p[0] = 1;
        free(p);
        free(p);
    } else if (!strcmp(mode, "small-double") || !strcmp(mode, "tiny-double")) {
        size_t n = mode[0] == 's' ? 24 : 1;
        char *keep = KEEP(malloc(n)), *p = KEEP(malloc(n));
        memset(p, 7, n);
        free(p);
        free(p);
        free(keep);
    } else if (!strcmp(mode, "thread-double")) {
        char *p = KEEP(malloc(40));
        pthread_t t;
        pthread_create(&t, NULL, free_it, p);
        pthread_join(t, NULL);
        free(p);
    } else if (!strcmp(mode, "misaligned")) {
        char *p = KEEP(malloc(40));
        free(p + 1);
    } else if (!strcmp(mode, "realloc-freed")) {
        char *p = KEEP(malloc(32));
        free(p);
        KEEP(realloc(p, 48));
    } else if (!strcmp(mode, "fine")) {
        for (int round = 0; round < 1000; round++) {
            char *p = KEEP(malloc(16 + round % 64));
            free(p);
            char *q = KEEP(malloc(16 + round % 64)); /* often p again */
            free(q);
            struct node *heads[64];
            for (int i = 0; i < 64; i++) {
                heads[i] = KEEP(malloc(sizeof(struct node)));
                heads[i]->next = heads[i]->prev = heads[i];
            }
            for (int i = 0; i < 64; i++)
                free(heads[i]);
            char *r = KEEP(realloc(KEEP(malloc(1)), 8));
            r = KEEP(realloc(r, 100));
            free(r);
        }
        puts("fine");
        return 0;
    }
    puts("not detected");
    return 0;
}
