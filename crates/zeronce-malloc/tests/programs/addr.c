/* Prints where a small block and a large one land: heap addresses must differ between
 * runs (address space layout randomisation), as under glibc. */
#include <stdio.h>
#include <stdlib.h>

static void *volatile sink;

int main(void) {
    void *small = malloc(24), *large = malloc(8 << 20);
    sink = small;
    sink = large;
    printf("%p %p\n", small, large);
    free(large);
    free(small);
    return 0;
}
