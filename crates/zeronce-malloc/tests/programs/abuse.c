/* Frees the allocator must refuse: a double free of a large block, or a pointer into one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    char *p = malloc(8 << 20);
    p[0] = 1;
    if (argc > 1 && !strcmp(argv[1], "interior")) {
        free(p + 4096);
    } else {
        free(p);
        free(p);
    }
    puts("not detected");
    return 0;
}
