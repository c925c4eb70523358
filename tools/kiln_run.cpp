// STUB: kiln-run (to be written).
#include <cstdio>
int main() { std::fprintf(stderr, "kiln-run: not implemented yet\n"); return 1; }
