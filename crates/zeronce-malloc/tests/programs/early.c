/* A library whose constructor allocates: loaded after libzeronce.so in LD_PRELOAD, so it
 * runs before libzeronce.so's own constructor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((constructor)) static void early(void) {
    unsigned char *p = calloc(1, 6 << 20);
    int zero = 1;
    for (size_t i = 0; i < (6 << 20); i += 4096) zero &= p[i] == 0;
    memset(p, 1, 6 << 20);
    char *s = malloc(100);
    s = realloc(s, 5 << 20);
    free(s);
    free(p);
    printf("constructor: zeroed %d\n", zero);
}
